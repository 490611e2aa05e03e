"""Communication strategies (``communication.strategy``) over real gloo groups and end to end.

Protocol tests run 2 or 3 processes that each drive one strategy the way a trainer does
(start, buckets of gated "batches" that add known increments to the shared tensors, flush,
barrier, agree, stop), then check the invariant of the strategy:

* ``async_ps`` and ``allreduce`` sum: every trainer ends with initial + every increment;
  ``allreduce`` between data-parallel replicas (``StrategyEnv.replicas``) averages instead;
* ``async_model_average``, ``decentralized`` and ``async_decentralized`` average: every
  trainer ends with initial + (every increment) / W (averaging conserves the sum of the
  trainers' values, and the agreement at the checkpoint is their mean);
* after ``agree`` the collective strategies hold the same values on every trainer, bit for bit;
* a synchronous strategy never lets a trainer run more than ``sync_every`` batches (plus one per
  worker) past its last completed round, even next to a slower trainer.

A strategy that exchanged nothing would leave each trainer with its own increments only, and
every check above fails.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.communication import get_codec
from bigembed.communication.primitives import peer_of
from bigembed.communication.strategies import (
    SharedTensors,
    StrategyEnv,
    make_strategy,
    strategy_class,
)
from bigembed.config import PRECISION_NAMES, STRATEGY_NAMES
from support.launches import launch_ranks, write_items_graph
from support.strategy_runs import WRITES, serialize_writes

NAMES = ["param/a", "adagrad/a", "emb/item", "emb_state/item"]
NUMELS = [300, 300, 40_000, 5_000]
BUCKETS, BATCHES, SYNC_EVERY = 3, 12, 4
SUMMING = {"async_ps", "allreduce"}
#: a strategy made for data-parallel replicas of one bucket: ``allreduce`` averages
REPLICAS = "+replicas"
DRIVEN = [*STRATEGY_NAMES, f"allreduce{REPLICAS}"]


def test_every_configured_strategy_is_implemented() -> None:
    classes = {name: strategy_class(name) for name in STRATEGY_NAMES}
    axes = {name: (c.centralized, c.synchronous) for name, c in classes.items()}
    assert axes == {
        "async_ps": (True, False),
        "allreduce": (True, True),
        "async_model_average": (True, False),
        "decentralized": (False, True),
        "async_decentralized": (False, False),
    }


@pytest.mark.parametrize("world", [2, 3, 4, 5, 6])
def test_peer_schedule_is_a_matching_that_meets_everybody(world: int) -> None:
    trainers = list(range(world))
    rounds = world - 1 if world % 2 == 0 else world
    met: set[frozenset[int]] = set()
    for r in range(rounds):
        peers = {t: peer_of(t, trainers, r) for t in trainers}
        for t, p in peers.items():
            if p is not None:
                assert p != t and peers[p] == t, (r, peers)  # symmetric
                met.add(frozenset((t, p)))
        assert sum(p is None for p in peers.values()) == world % 2
    assert len(met) == world * (world - 1) // 2  # every pair once per cycle


def _increments(rank: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per batch, per tensor: (indices, values) this rank adds (values > 0: accumulators too)."""
    rng = np.random.default_rng(10 + rank)
    return [
        [
            (
                torch.from_numpy(rng.integers(0, n, 50)),
                torch.from_numpy(rng.random(50).astype(np.float32) * 1e-2 + 1e-3),
            )
            for n in NUMELS
        ]
        for _ in range(BUCKETS * BATCHES)
    ]


def _initial() -> list[torch.Tensor]:
    return [torch.linspace(0, 1, n) for n in NUMELS]


def _drive(
    rank: int, world: int, side: Any, strategy: str, precision: str, store: str
) -> dict[str, Any]:
    """One trainer's part of one strategy's run; returns what the checks read."""
    import torch.distributed as dist

    errors: list[str] = []
    tensors = _initial() if rank == 0 else [torch.zeros(n) for n in NUMELS]
    for t in tensors:
        dist.broadcast(t, src=0)  # as the trainer does before the strategy starts
    strategy, replicas = strategy.removesuffix(REPLICAS), strategy.endswith(REPLICAS)
    env = StrategyEnv(
        rank=rank,
        trainers=list(range(world)),
        group=None,
        codec=get_codec(precision),
        workers=1,
        sync_every=SYNC_EVERY,
        sync_interval=0.01,
        on_error=lambda message: (errors.append(message), print(message, file=sys.stderr)),
        store_client=lambda: dist.FileStore(store + ".pairs", -1),
        replicas=replicas,
    )
    s = make_strategy(strategy, env, SharedTensors(NAMES, tensors, frozenset({1, 3})))
    s.start()
    lag: list[int] = []  # batches a trainer was ahead of its last completed round, per batch
    batch = 0
    for bucket in range(BUCKETS):
        s.bucket_started()
        rounds_before = s.rounds
        for b in range(BATCHES):
            if s.gate is not None:
                s.gate.wait_turn()
            done = getattr(getattr(s, "rounds_thread", None), "_completed_batches", None)
            lag.append(batch - done if done is not None else -1)
            with WRITES:  # (see serialize_writes)
                for t, (idx, val) in zip(
                    tensors, _increments(rank)[bucket * BATCHES + b], strict=True
                ):
                    t.index_add_(0, idx, val)
            if rank == world - 1:
                time.sleep(0.01)  # the slow trainer: the others must wait for it when synchronous
            if s.gate is not None:
                s.gate.passed(0)
            batch += 1
        if not s.synchronous:
            _await_round(s, rounds_before)
        s.bucket_finished()
    if not s.agreement_merges_everything:  # as the data-parallel trainer does at a bucket's end
        s.flush(30)
        dist.barrier(group=side)
    before = [t.clone() for t in tensors]  # what the rounds did, before the exact agreement
    s.agree(30)
    dist.barrier(group=side)
    result = {
        "tensors": [t.clone() for t in tensors],
        "before": before,
        "errors": errors,
        "lag": lag,
        "rounds": s.rounds,
        "sent": s.bytes_sent,
        "received": s.bytes_received,
    }
    s.stop()
    return result


def _await_round(s: Any, since: int, timeout: float = 5.0) -> None:
    """Until ``s`` completed a round after its ``since``-th (at most ``timeout`` s). An
    asynchronous strategy's rounds run beside the batches, as often as the machine lets them
    (at most a tenth of a core each): on a loaded machine a bucket of these short batches could
    pass without one, and the mixing check would measure the load, not the strategy. A strategy
    that never exchanges still fails that check."""
    deadline = time.monotonic() + timeout
    while s.rounds <= since and time.monotonic() < deadline:
        time.sleep(0.005)


def _rank(rank: int, world: int, store: str, out: str, precisions: list[str]) -> None:
    """Every precision of this world, and every strategy, in turn over one gloo group (one
    process start per world, not per case: the starts were most of these tests' time); each
    result saved apart."""
    import faulthandler

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    side = dist.new_group(backend="gloo")  # the test's own barrier, apart from the strategy's
    serialize_writes()  # exact sums: the trainer's writes and the rounds' applies never overlap
    for precision in precisions:
        for strategy in DRIVEN:
            faulthandler.dump_traceback_later(60, exit=True)  # a hang fails with the stacks
            # a pair-store file per precision, as when each precision had its own processes
            result = _drive(rank, world, side, strategy, precision, f"{store}-{precision}")
            torch.save(result, os.path.join(out, f"{strategy}-{precision}-{rank}.pt"))
            dist.barrier(group=side)  # the next case starts from a quiet group
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def _run(tmp: Path, world: int, precisions: list[str]) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(
        _rank,
        args=(world, str(tmp / "store"), str(tmp), precisions),
        nprocs=world,
        join=True,
        start_method="spawn",
    )


@pytest.fixture(scope="module")
def gloo_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str, str, int], list[dict[str, Any]]]:
    """Per world: one run of every precision of CASES with that world and every strategy,
    started on first use."""
    root = tmp_path_factory.mktemp("gloo")
    done: set[int] = set()

    def results(strategy: str, precision: str, world: int) -> list[dict[str, Any]]:
        where = root / f"world{world}"
        if world not in done:
            where.mkdir(exist_ok=True)
            _run(where, world, [p for p, w in PRECISION_WORLDS if w == world])
            done.add(world)
        return [torch.load(where / f"{strategy}-{precision}-{r}.pt") for r in range(world)]

    return results


def _expected(world: int, strategy: str) -> list[torch.Tensor]:
    want = [t.double() for t in _initial()]
    total = [torch.zeros(n, dtype=torch.float64) for n in NUMELS]
    for rank in range(world):
        for step in _increments(rank):
            for w, (idx, val) in zip(total, step, strict=True):
                w.index_add_(0, idx, val.double())
    scale = 1.0 if strategy in SUMMING else 1.0 / world
    return [w + scale * t for w, t in zip(want, total, strict=True)]


PRECISION_WORLDS = [("fp32", 2), ("int8", 3), ("bf16", 2), ("fp16", 3)]
CASES = [
    (strategy, precision, world) for strategy in DRIVEN for precision, world in PRECISION_WORLDS
]


@pytest.mark.integration
@pytest.mark.parametrize(("strategy", "precision", "world"), CASES)
def test_strategy_invariant_over_gloo(
    gloo_results: Callable[[str, str, int], list[dict[str, Any]]],
    strategy: str,
    precision: str,
    world: int,
) -> None:
    results = gloo_results(strategy, precision, world)
    want = _expected(world, strategy)
    # fp32: float rounding only; else about one message's error on values <= ~1.3
    tol = {"fp32": 2e-5, "fp16": 5e-3, "bf16": 2e-2, "int8": 2e-2}[precision]
    for rank, res in enumerate(results):
        assert not res["errors"], res["errors"]
        assert res["rounds"] > 0, res
        for name, got, w in zip(NAMES, res["tensors"], want, strict=True):
            err = float((got.double() - w).abs().max())
            assert err <= tol, (strategy, precision, rank, name, err)
            if name.startswith(("adagrad/", "emb_state/")):
                assert float(got.min()) >= 0, (rank, name)
    sent, received = (sum(r[k] for r in results) for k in ("sent", "received"))
    assert sent > 0 and received > 0
    if strategy != "async_ps":  # (a sharer may be mid-round when the counters are read)
        assert sent == received  # every byte one trainer sent, another received
    if strategy != "async_ps":  # agreed before the checkpoint: the same bits everywhere
        for res in results[1:]:
            for a, b in zip(results[0]["tensors"], res["tensors"], strict=True):
                assert torch.equal(a, b)
    # The rounds, not only the final agreement, mixed the trainers' values: before agree() the
    # trainers are at most half as far apart as trainers that exchanged nothing would be.
    alone = [_initial() for _ in results]
    for rank, values in enumerate(alone):
        for step in _increments(rank):
            for t, (idx, val) in zip(values, step, strict=True):
                t.index_add_(0, idx, val)

    def spread(per_rank: list[list[torch.Tensor]]) -> float:
        mean = [sum(ts) / len(ts) for ts in zip(*per_rank, strict=True)]
        return max(
            float((t - m).abs().max()) for ts in per_rank for t, m in zip(ts, mean, strict=True)
        )

    # A strategy whose agreement merges everything is not flushed first (see _drive): the
    # batches since its last round are still unmixed, so it gets a looser bound.
    cls = strategy_class(strategy.removesuffix(REPLICAS))
    flushed = not cls.agreement_merges_everything
    bound = 0.5 if flushed else 0.75
    assert spread([r["before"] for r in results]) <= bound * spread(alone), strategy
    if cls.synchronous:
        for rank, res in enumerate(results):
            assert max(res["lag"]) <= SYNC_EVERY, (rank, res["lag"])


def test_a_round_is_recorded_complete_before_the_gate_opens() -> None:
    """The round thread opens the gate (the next ``sync_every`` batches) only after it has
    recorded the round as completed: a worker let through never sees the previous round's
    batch count (opening first let the gloo invariant above read a lag of sync_every + 1)."""
    from bigembed.communication.lockstep import LockstepRounds
    from bigembed.train.hogwild.gate import BatchGate

    seen: list[tuple[int, int]] = []  # (budget opened, completed batches at that moment)

    class RecordingGate(BatchGate):
        def allow(self, budget: int) -> None:
            if rounds is not None:
                seen.append((budget, rounds._completed_batches))
            super().allow(budget)

    rounds: LockstepRounds | None = None
    gate = RecordingGate(1)
    rounds = LockstepRounds(
        0,
        [0],
        None,
        gate,
        gated=True,
        sync_every=2,
        interval=0.01,
        on_data=lambda: None,
        on_agree=lambda: None,
        on_error=lambda message: None,
        name="test-rounds",
    )
    rounds.set_training(True)
    rounds.start()
    for _ in range(7):
        gate.wait_turn()
        gate.passed(0)
    rounds.stop(10)
    assert len(seen) >= 3, seen
    assert all(completed == budget - 2 for budget, completed in seen), seen


def test_interval_rounds_take_at_most_a_tenth_of_a_core() -> None:
    """Rounds not driven by the gate (asynchronous strategies, idle trainers) come every
    ``sync_interval`` unless their CPU would take more than MAX_CPU_SHARE of a core: rounds
    that burn 10 ms of CPU come at most every 100 ms, not every millisecond."""
    from bigembed.communication.lockstep import LockstepRounds
    from bigembed.communication.sharer import MAX_CPU_SHARE
    from bigembed.train.hogwild.gate import BatchGate

    def burn() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.01:
            pass

    gate = BatchGate(1)
    rounds = LockstepRounds(
        0,
        [0],
        None,
        gate,
        gated=False,
        sync_every=2,
        interval=0.001,
        on_data=burn,
        on_agree=lambda: None,
        on_error=lambda message: None,
        name="test-cpu-cap",
    )
    rounds.start()
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        gate.passed(0)  # new batches: every round is a data round
        time.sleep(0.002)
    rounds.stop(10)
    elapsed = time.monotonic() - started
    assert 2 <= rounds.data_rounds <= elapsed * MAX_CPU_SHARE / 0.01 + 2, rounds.data_rounds


# ---------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def items_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], float]:
    """The shared-heavy graph of test_comm_dist (users partitioned, items shared) and its
    single-machine withheld MRR (1 rank, 2 workers)."""
    root = tmp_path_factory.mktemp("items")
    graph = write_items_graph(root)
    _, (mrr, auc), _ = launch_ranks(root, graph, "fp32", ranks=1, overrides=("workers=2",))
    assert auc > 0.95, auc  # learnt: the comparison means something
    return root, graph, mrr


# Every strategy and every precision at least once, each run a 2-rank launch: the strategies other
# than async_ps once each, with the three precisions other than fp32; every strategy x
# precision pair is checked over gloo above. async_ps (the default) with fp32 and int8 on this
# graph is test_comm_dist's int8-vs-fp32 test.
END_TO_END = [
    ("allreduce", "int8"),
    ("async_model_average", "bf16"),
    ("decentralized", "fp16"),
    ("async_decentralized", "int8"),
]
assert {s for s, _ in END_TO_END} | {"async_ps"} == set(STRATEGY_NAMES)
assert {p for _, p in END_TO_END} | {"fp32"} == set(PRECISION_NAMES)


@pytest.mark.integration
@pytest.mark.parametrize(("strategy", "precision"), END_TO_END)
def test_strategy_trains_as_well_as_one_machine(
    items_graph: tuple[Path, dict[str, Any], float], strategy: str, precision: str
) -> None:
    """``bigembed launch -n 2 -p communication.strategy=S -p communication.precision=P``: the
    run ends cleanly, every committed value is finite, accumulators >= 0, and the withheld MRR
    is within 0.02 of one machine's on the same graph and seed. fp32 and int8 run with 2
    Hogwild workers per trainer (PBG's default of several workers; the gate across processes),
    the casts with 1 (the gate in the trainer's own thread)."""
    root, graph, single = items_graph
    workers = 2 if precision in ("fp32", "int8") else 1
    values, (mrr, _), per_round = launch_ranks(
        root, graph, precision, strategy, overrides=(f"workers={workers}",)
    )
    for name, got in values.items():
        assert bool(torch.isfinite(got).all()), name
        if "state" in name or "adagrad" in name:
            assert float(got.min()) >= 0, name
    assert all(b > 0 for b in per_round), per_round  # both trainers exchanged data
    assert abs(mrr - single) <= 0.02, (strategy, precision, mrr, single)


@pytest.mark.integration
@pytest.mark.parametrize(
    "strategy", ["allreduce", "async_model_average", "decentralized", "async_decentralized"]
)
def test_kill9_stops_every_strategy_and_the_checkpoint_resumes(
    tmp_path: Path, strategy: str
) -> None:
    """A trainer killed mid-run: the other ends within distributed_timeout (+ slack) naming it,
    whatever the strategy (its round thread waits for the dead peer); the committed checkpoint
    resumes to the end with every step trained once, with the same strategy."""
    import signal

    from bigembed.checkpoints.store import CheckpointStore
    from support.ranks import TIMEOUT, free_port, make_graph, start_rank

    epochs = 4  # killed after 2: alone, the survivor cannot finish the 2 left (returncode != 0)
    cfg_path, cfg = make_graph(tmp_path, num_epochs=epochs)
    extra = ("-p", f"communication.strategy={strategy}", "-p", "communication.precision=int8")
    store = CheckpointStore(cfg.checkpoint_path)
    port = free_port()
    procs = [start_rank(cfg_path, r, port, *extra) for r in (0, 1)]
    deadline = time.monotonic() + 90
    while store.committed_version() < 2 and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        time.sleep(0.05)
    os.killpg(procs[1].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    out, _ = procs[0].communicate(timeout=TIMEOUT + 30)
    waited = time.monotonic() - killed_at
    procs[1].wait()
    assert procs[0].returncode != 0
    assert waited < TIMEOUT + 10, f"rank 0 took {waited:.1f}s to notice"
    assert "rank 1 (trainer)" in out and "Traceback" not in out, out
    version = store.committed_version()
    assert 2 <= version < epochs

    port = free_port()
    procs = [start_rank(cfg_path, r, port, *extra) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    steps = [r["version"] for r in store.read_stats() if r["type"] == "step"]
    assert steps == list(range(1, epochs + 1)), "no step lost or trained twice"
