"""Shared parameters in distributed mode: tests that cannot pass without the exchange.

End to end (real ranks on 127.0.0.1): graphs whose buckets touch disjoint relation types or
disjoint rows of an unpartitioned entity type, so what one trainer learns reaches the
checkpoint (written by rank 0) only through the parameter servers. Then the protocol itself:
the delta/merge rounds of :class:`Sharer` and :class:`ParameterServer` in process and over a
real gloo group, exact sums of shared Adagrad accumulators, and the round throttles with an
injected clock.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.checkpoints.store import CheckpointStore
from bigembed.communication.param_server import ParameterServer, ShardPlan, gather
from bigembed.communication.sharer import (
    MAX_BYTES_PER_S,
    MAX_CPU_SHARE,
    MAX_ROUNDS_PER_S,
    Pacer,
    Sharer,
)
from bigembed.config import model_spec
from bigembed.model.scoring import ScoringModel
from bigembed.train.memory.partitions import init_embeddings
from support.graphs import graph_config, planted, save_config, write_buckets
from support.ranks import CLI, ENV, TIMEOUT, check_events, free_port, read_events, run


def trainers_per(cfg: Any, key: str) -> dict[int, set[int]]:
    """For each value of a bucket record's ``key`` (e.g. lhs_partition): the trainers of it."""
    out: dict[int, set[int]] = defaultdict(set)
    for r in CheckpointStore(cfg.checkpoint_path).read_stats():
        if r["type"] == "bucket":
            out[r[key]].add(r["trainer"])
    return out


def final_payload(cfg: Any) -> dict[str, Any]:
    store = CheckpointStore(cfg.checkpoint_path)
    return store.load_model(store.committed_version())


def start_ranks(
    cfg_path: Path, method: str, env: dict[str, str] | None = None, ranks: int = 2
) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [
                *CLI,
                "train",
                str(cfg_path),
                "--rank",
                str(r),
                "--no-progress",
                "-p",
                f"num_machines={ranks}",
                "-p",
                f"distributed_init_method={method}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or ENV,
            start_new_session=True,
        )
        for r in range(ranks)
    ]


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), outs
    return outs


# ---------------------------------------------------------------------- end to end
@pytest.mark.integration
def test_relation_parameters_reach_the_checkpoint_only_by_sharing(tmp_path: Path) -> None:
    """Relation p lives only in bucket (p, p) of 4 partitions: the buckets are disjoint, so two
    trainers run them side by side, and rank 0 writes the model (a snapshot after each of 2
    epochs). In every epoch every relation row must move in rank 0's checkpoint, Adagrad state
    included -- also the rows that only rank 1 trained in that epoch, which reach rank 0 only
    through the parameter servers (without them rank 0 would save those rows unchanged)."""
    rng = np.random.default_rng(1)
    n, parts = 200, 4
    write_buckets(
        tmp_path,
        {"node": [n] * parts},
        [f"r{p}" for p in range(parts)],
        True,
        {(p, p): planted(rng, n, n, 8000, p) for p in range(parts)},
        (parts, parts),
    )
    for attempt in range(3):  # which trainer gets which bucket is up to the lock server
        cfg = graph_config(
            tmp_path,
            num_partitions=parts,
            num_epochs=2,
            dimension=16,
            distributed_timeout=TIMEOUT,
            checkpoint_preservation_interval=1,
            checkpoint_path=str(tmp_path / f"m{attempt}"),
        )
        out = run(["launch", str(save_config(tmp_path, cfg)), "-n", "2"])
        assert out.returncode == 0, out.stdout + out.stderr
        check_events(read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl"))
        who: dict[tuple[int, int], set[int]] = defaultdict(set)  # (version, relation) -> trainers
        for r in CheckpointStore(cfg.checkpoint_path).read_stats():
            if r["type"] == "bucket":  # bucket (p, p) holds relation p only
                who[r["version"], r["lhs_partition"]].add(r["trainer"])
        assert sorted(who) == [(v, p) for v in (1, 2) for p in range(parts)]
        foreign = [k for k, trainers in who.items() if 0 not in trainers]
        if foreign:
            break
    assert foreign, f"rank 0 trained every relation 3 times: nothing proven ({dict(who)})"

    initial = ScoringModel(model_spec(cfg, parts)).state_dict()
    snaps = [{"model": initial, "optimizer": [torch.zeros_like(t) for t in initial.values()]}]
    for epoch in (1, 2):
        snap = CheckpointStore(Path(cfg.checkpoint_path) / f"epoch_{epoch}")
        snaps.append(snap.load_model(snap.committed_version()))
    for version in (1, 2):
        before, after = snaps[version - 1], snaps[version]
        for k, name in enumerate(initial):
            assert after["model"][name].shape[0] == parts, name  # one row per relation
            for r in range(parts):
                moved = float((after["model"][name][r] - before["model"][name][r]).abs().max())
                grown = float((after["optimizer"][k][r] - before["optimizer"][k][r]).min())
                where = f"{name} row {r} in epoch {version} (trained by {who[version, r]})"
                assert moved > 1e-4, f"{where} did not move"
                assert grown > 0, f"{where}: Adagrad state did not grow"


@pytest.mark.integration
def test_unpartitioned_entities_merge_rows_from_both_trainers(tmp_path: Path) -> None:
    """user (2 partitions) -> item (unpartitioned, on the parameter servers), 2 Hogwild workers
    per rank, ranks joined through env://. Users of partition p only meet items of half p, so
    each half of the item table is trained by whichever trainer holds the bucket (p, 0)."""
    rng = np.random.default_rng(2)
    users, items = 300, 200
    write_buckets(
        tmp_path,
        {"user": [users, users], "item": [items]},
        ["buys"],
        False,
        {
            (0, 0): planted(rng, users, items, 20000, 0, 0, items // 2),
            (1, 0): planted(rng, users, items, 20000, 0, items // 2, items),
        },
        (2, 1),
    )
    base = graph_config(
        tmp_path,
        entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
        relations=[{"name": "buys", "lhs": "user", "rhs": "item", "operator": "translation"}],
        dynamic_relations=False,
        num_epochs=1,
        dimension=16,
        workers=2,
        distributed_timeout=TIMEOUT,
    )
    for attempt in range(3):  # which trainer gets which bucket is up to the lock server
        cfg = base.model_copy(update={"checkpoint_path": str(tmp_path / f"m{attempt}")})
        env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        outs = finish(start_ranks(save_config(tmp_path, cfg), "env://", env))
        assert "env://" in outs[0]
        granted = check_events(read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl"))
        assert sorted(granted[0]) == [(0, 0), (1, 0)]
        by_half = trainers_per(cfg, "lhs_partition")
        foreign = [p for p in (0, 1) if 0 not in by_half[p]]
        if foreign:
            break
    assert foreign, f"rank 0 trained both halves 3 times: nothing proven ({dict(by_half)})"

    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    emb, state = torch.empty(items, 16), torch.empty(items)
    store.load_partition("item", 0, version, emb, state)
    start = init_embeddings(items, 16, cfg.init_scale, cfg.seed, "item", 0)
    half = items // 2
    for p in (0, 1):
        rows = slice(p * half, (p + 1) * half)
        moved = (emb[rows] - start[rows]).abs().amax(dim=1)
        # nearly every item of the half is the rhs of some edge of bucket (p, 0)
        assert float((moved > 1e-4).float().mean()) > 0.9, (p, by_half[p])
        assert float((state[rows] > 0).float().mean()) > 0.9, (p, by_half[p])


@pytest.mark.integration
def test_file_init_method(tmp_path: Path) -> None:
    """Two ranks rendezvous through a FileStore (file://), train 2 epochs, remove the file."""
    from support.ranks import bucket_records, make_graph

    cfg_path, cfg = make_graph(tmp_path, num_epochs=2)
    store_file = tmp_path / "rendezvous"
    outs = finish(start_ranks(cfg_path, f"file://{store_file}"))
    assert "Traceback" not in outs[0] + outs[1]
    granted = check_events(read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl"))
    assert all(sum(granted[it].values()) == 16 for it in (0, 1))
    assert all(len(b) == 16 for b in bucket_records(cfg).values())
    assert CheckpointStore(cfg.checkpoint_path).committed_version() == 2
    assert not store_file.exists(), "rank 0 removes the store file after a clean run"


# ---------------------------------------------------------------------- the protocol, in process
def _plan_one_server(numels: list[int]) -> ShardPlan:
    return ShardPlan([f"t{k}" for k in range(len(numels))], numels, [0])


def test_local_round_merges_deltas_and_keeps_inflight_updates() -> None:
    """One round: the server adds the client's delta; the client gets the merged value and keeps
    what it changed after its snapshot."""
    shared = [torch.zeros(4), torch.zeros(2, 3)]
    plan = _plan_one_server([4, 6])
    flat = [t.view(-1) for t in shared]
    server = ParameterServer(0, gather(flat, plan.segments[0]), [0], None, lambda m: None)
    other = torch.arange(10, dtype=torch.float32)  # another trainer's contribution, already in
    server.value += other
    sharer = Sharer(0, plan, shared, server, None, lambda m: None)
    shared[0] += torch.tensor([1.0, 2.0, 3.0, 4.0])
    sharer._round()
    expect = other.clone()
    expect[:4] += torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(server.value, expect)
    assert torch.equal(gather(flat, plan.segments[0]), expect), "the client sees the merged value"
    assert torch.equal(sharer.last[0], expect)
    sharer._round()  # nothing changed: an empty delta, nothing moves
    assert torch.equal(server.value, expect)


def test_n_clients_accumulators_add_up_exactly() -> None:
    """N trainers' Adagrad accumulators (sums of squared gradients) on one server: after every
    client's last round, server value == initial + every client's increments, exactly, and a
    final pull gives every client that value. Integer-valued increments keep float sums exact.
    """
    clients, size, rounds = 4, 50, 30
    rng = np.random.default_rng(0)
    initial = torch.from_numpy(rng.integers(0, 5, size).astype(np.float32))
    plan = _plan_one_server([size])
    server = ParameterServer(0, initial, [0], None, lambda m: None)
    tensors = [initial.clone() for _ in range(clients)]
    sharers = [Sharer(0, plan, [t], server, None, lambda m: None) for t in tensors]
    total = torch.zeros(size)
    for _ in range(rounds):
        for t, s in zip(tensors, sharers, strict=True):
            for _ in range(int(rng.integers(0, 3))):  # a few steps between rounds
                g = torch.from_numpy(rng.integers(-3, 4, size).astype(np.float32))
                t += g * g
                total += g * g
            if rng.random() < 0.7:
                s._round()
    for s in sharers:
        s._round()  # push
    assert torch.equal(server.value, initial + total)
    for t, s in zip(tensors, sharers, strict=True):
        s._round()  # pull
        assert torch.equal(t, initial + total)


def test_sharer_thread_flush_pushes_and_pulls() -> None:
    """With the loop running: a flush after a change pushes it; a flush on another client
    pulls it (the flush waits for a round that starts after the call)."""
    plan = _plan_one_server([8])
    a, b = torch.zeros(8), torch.zeros(8)
    server = ParameterServer(0, torch.zeros(8), [0], None, lambda m: None)
    errors: list[str] = []
    sa = Sharer(0, plan, [a], server, None, errors.append)
    sb = Sharer(0, plan, [b], server, None, errors.append)
    sa.start()
    sb.start()
    try:
        for k in range(5):
            a[k] += 2.0
            b[7 - k] += 1.0
            sa.flush(10)
            sb.flush(10)
        sa.flush(10)
        want = torch.tensor([2.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 1.0])
        assert torch.equal(server.value, want)
        assert torch.equal(a, want) and torch.equal(b, want)
    finally:
        sa.stop()
        sb.stop()
    assert not errors


# ---------------------------------------------------------------------- the throttles
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _simulate(
    pacer: Pacer, clock: FakeClock, round_s: float, nbytes: int, until: float
) -> tuple[int, int]:
    rounds = moved = 0
    while clock.now < until:
        began = clock()
        clock.sleep(round_s)
        rounds += 1
        moved += nbytes
        clock.sleep(pacer.pause(began, nbytes))
    return rounds, moved


@pytest.mark.parametrize(
    ("round_s", "nbytes", "limit"),
    [
        (0.0, 1000, "rounds"),  # tiny fast rounds: the 100/s cap
        (0.002, 1000, "rounds"),  # rounds take 2 ms: still the 100/s cap
        (0.0, 50_000_000, "bytes"),  # 50 MB rounds: 1 GB/s allows 20 per second
        (0.03, 50_000_000, "bytes"),  # 30 ms rounds of 50 MB: still 1 GB/s
        (0.03, 1000, "slow"),  # slower than both caps: no pause at all
    ],
)
def test_pacer_caps_rounds_and_bytes(round_s: float, nbytes: int, limit: str) -> None:
    clock = FakeClock()
    pacer = Pacer(MAX_ROUNDS_PER_S, MAX_BYTES_PER_S, clock)
    seconds = 10.0
    rounds, moved = _simulate(pacer, clock, round_s, nbytes, seconds)
    elapsed = clock.now
    assert rounds / elapsed <= MAX_ROUNDS_PER_S * 1.0001
    assert moved / elapsed <= MAX_BYTES_PER_S * 1.0001
    expected = {
        "rounds": MAX_ROUNDS_PER_S,
        "bytes": MAX_BYTES_PER_S / nbytes,
        "slow": 1 / max(round_s, 1e-9),
    }[limit]
    assert rounds / elapsed == pytest.approx(expected, rel=0.01), "the throttle is not too tight"


def test_pacer_caps_the_round_threads_share_of_a_core() -> None:
    """Rounds that take 5 ms of CPU each (a large dense shared set) run at most every 50 ms:
    the round thread takes at most MAX_CPU_SHARE of a core from the training step; cheap
    rounds keep PBG's 100 per second."""
    clock = FakeClock()
    pacer = Pacer(MAX_ROUNDS_PER_S, MAX_BYTES_PER_S, clock)
    rounds = cpu = 0.0
    while clock.now < 10.0:
        began = clock()
        clock.sleep(0.005)  # a round that is all CPU
        rounds += 1
        cpu += 0.005
        clock.sleep(pacer.pause(began, 1000, cpu_seconds=0.005))
    assert cpu / clock.now == pytest.approx(MAX_CPU_SHARE, rel=0.01)
    assert rounds / clock.now == pytest.approx(MAX_CPU_SHARE / 0.005, rel=0.01)
    assert pacer.pause(clock(), 1000, cpu_seconds=1e-5) == pytest.approx(1 / MAX_ROUNDS_PER_S)


def test_sharer_loop_is_paced_by_its_clock() -> None:
    """The sharer thread itself obeys the pacer: on a fake clock that only advances when the
    loop pauses, 2 fake seconds hold at most 201 rounds at 100 rounds/s, and at most 2 GB of
    (simulated remote) traffic at 1 GB/s."""
    clock = FakeClock()
    done = threading.Event()

    class Loop(Sharer):
        moved = 0

        def _round(self) -> int:
            self.rounds += 1
            self.moved += self.fake_bytes
            return self.fake_bytes

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 2.0:
            loop._stop.set()
            done.set()

    for fake_bytes, cap in ((10, 201), (100_000_000, 21)):
        plan = _plan_one_server([4])
        t = torch.zeros(4)
        server = ParameterServer(0, torch.zeros(4), [0], None, lambda m: None)
        clock.now = 0.0
        done.clear()
        loop = Loop(0, plan, [t], server, None, lambda m: None, clock=clock, sleep=sleep)
        loop.fake_bytes = fake_bytes
        loop.start()
        paced = done.wait(10)
        loop.stop()
        assert paced, "the fake clock never reached 2 s: the loop does not pause"
        assert cap - 2 <= loop.rounds <= cap, (fake_bytes, loop.rounds)
        assert loop.moved <= max(MAX_BYTES_PER_S * 2, fake_bytes) + fake_bytes


# ---------------------------------------------------------------------- over gloo, 2 processes
def _gloo_rank(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    errors: list[str] = []
    # names chosen so that both servers hold something; the big one is split over both
    names = ["adagrad/a", "adagrad/b", "param/c", "big"]
    numels = [37, 5, 11, 3_000_000]
    plan = ShardPlan(names, numels, list(range(world)))
    assert all(plan.size(s) > 0 for s in range(world))
    initial = [torch.arange(n, dtype=torch.float32) % 7 for n in numels]
    tensors = [t.clone() for t in initial]
    flat = [t.view(-1) for t in tensors]
    server = ParameterServer(
        rank, gather(flat, plan.segments[rank]), list(range(world)), None, errors.append
    )
    server.start()
    sharer = Sharer(rank, plan, tensors, server, None, errors.append)
    rng = np.random.default_rng(100 + rank)
    mine = [torch.zeros(n) for n in numels]
    for _ in range(6):
        for t, m in zip(tensors, mine, strict=True):
            idx = torch.from_numpy(rng.integers(0, t.numel(), 20))
            g = torch.from_numpy(rng.integers(-3, 4, 20).astype(np.float32))
            t.view(-1).index_add_(0, idx, g * g)  # what an Adagrad step does to its state
            m.index_add_(0, idx, g * g)
        sharer._round()
    sharer._round()  # push the last increments
    dist.barrier()
    sharer._round()  # pull everybody's
    sharer.stop()  # says goodbye to the remote servers (the thread never ran)
    for s in range(world):
        if s != rank:
            dist.send(torch.tensor([2, 0]), dst=s, tag=11)
    server.join(30)
    torch.save(
        {
            "tensors": tensors,
            "mine": mine,
            "server": server.value,
            "segments": [(g.tensor, g.start, g.end) for g in plan.segments[rank]],
            "errors": errors,
            "sent": sharer.bytes_sent,
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_processes_over_gloo_sum_exactly(tmp_path: Path) -> None:
    """Two ranks, each hosting a shard and running rounds over a real gloo group (loopback):
    after push, barrier, pull, both ranks hold initial + both ranks' increments, exactly, and
    each server's shard equals the same values."""
    import torch.multiprocessing as mp

    world = 2
    mp.start_processes(
        _gloo_rank,
        args=(world, str(tmp_path / "store"), str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    numels = [37, 5, 11, 3_000_000]
    initial = [torch.arange(n, dtype=torch.float32) % 7 for n in numels]
    for r, res in enumerate(results):
        assert not res["errors"], res["errors"]
        assert res["sent"] > 0, "rank {r} sent its deltas over gloo"
        for k in range(len(numels)):
            want = initial[k] + sum(x["mine"][k] for x in results)
            assert torch.equal(res["tensors"][k], want), (r, k)
        shard = torch.cat(
            [
                initial[t][a:b] + sum(x["mine"][t][a:b] for x in results)
                for t, a, b in res["segments"]
            ]
        )
        assert torch.equal(res["server"], shard), r
