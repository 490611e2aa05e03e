"""Low-precision shared-parameter exchange over a real gloo group (2 processes, loopback).

The sharer and parameter servers with ``communication.precision`` int8 (and fp16/bf16): after
many rounds of float updates, push, barrier and pull, both trainers hold the exact sum of all
updates up to one message's quantization error (error feedback on both directions keeps it from
accumulating), and the traffic is >= 3x smaller than fp32 on the same rounds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.communication import get_codec
from bigembed.communication.param_server import ParameterServer, ShardPlan, gather
from bigembed.communication.sharer import Sharer
from support.graphs import graph_config, planted, save_config, write_buckets
from support.launches import launch_ranks, write_items_graph

NAMES = ["adagrad/a", "param/b", "param/c", "big"]
NUMELS = [37, 2500, 11, 400_000]
SPLIT_BYTES = 2**20  # the ranks' param_server.SPLIT_BYTES: "big" is split over both servers
ROUNDS = 30
EXCHANGED = ["fp32", "int8", "bf16"]  # the precisions run over one group, in turn


def _updates(rank: int, numels: list[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per round, per tensor: (indices, values) of this rank's updates (small, positive-biased
    values: quantizing their sums without error feedback would drift)."""
    rng = np.random.default_rng(100 + rank)
    return [
        [
            (
                torch.from_numpy(rng.integers(0, n, min(n, 400))),
                torch.from_numpy(rng.random(min(n, 400)).astype(np.float32) * 1e-2 + 1e-3),
            )
            for n in numels
        ]
        for _ in range(ROUNDS)
    ]


def _exchange(rank: int, world: int, precision: str) -> dict[str, Any]:
    """One precision's rounds over the group: this rank's server and sharer, ROUNDS rounds of
    updates, then the last increments and everybody's pulled; returns what the checks read."""
    import torch.distributed as dist

    errors: list[str] = []
    codec = get_codec(precision)
    plan = ShardPlan(NAMES, NUMELS, list(range(world)))
    assert all(plan.size(s) > 0 for s in range(world))
    tensors = [torch.linspace(-1, 1, n) for n in NUMELS]
    flat = [t.view(-1) for t in tensors]
    server = ParameterServer(
        rank,
        gather(flat, plan.segments[rank]),
        list(range(world)),
        None,
        errors.append,
        codec,
        sizes=[seg.size for seg in plan.segments[rank]],
    )
    server.start()
    sharer = Sharer(rank, plan, tensors, server, None, errors.append, codec=codec)
    for step in _updates(rank, NUMELS):
        for t, (idx, val) in zip(tensors, step, strict=True):
            t.view(-1).index_add_(0, idx, val)
        sharer._round()
    for _ in range(3):  # push the last increments, and their residuals
        sharer._round()
    dist.barrier()
    for _ in range(3):  # pull everybody's
        sharer._round()
    sharer.stop()
    for s in range(world):
        if s != rank:
            dist.send(torch.tensor([2, 0]), dst=s, tag=11)
    server.join(30)
    dist.barrier()  # the next precision's server starts on a quiet group
    return {
        "tensors": tensors,
        "errors": errors,
        "sent": sharer.bytes_sent,
        "received": sharer.bytes_received,
        "server_sent": server.bytes_sent,
        "server_received": server.bytes_received,
    }


def _rank(rank: int, world: int, store_path: str, out_dir: str) -> None:
    """Every precision in turn over one gloo group (one process start for all of them)."""
    import torch.distributed as dist

    from bigembed.communication import param_server

    torch.set_num_threads(1)
    # a tensor over SPLIT_BYTES is split between the servers; the default (10 MiB) would need a
    # 3M-value tensor, whose rounds were most of this test's time
    param_server.SPLIT_BYTES = SPLIT_BYTES
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    for precision in EXCHANGED:
        result = _exchange(rank, world, precision)
        torch.save(result, os.path.join(out_dir, f"{precision}{rank}.pt"))
    dist.destroy_process_group()


def _expected() -> list[torch.Tensor]:
    want = [torch.linspace(-1, 1, n).double() for n in NUMELS]
    for rank in range(2):
        for step in _updates(rank, NUMELS):
            for w, (idx, val) in zip(want, step, strict=True):
                w.index_add_(0, idx, val.double())
    return want


@pytest.fixture(scope="module")
def exchanges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Per precision, both ranks' results (one run of 2 spawned processes)."""
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("exchanges")
    mp.start_processes(
        _rank, args=(2, str(tmp / "store"), str(tmp)), nprocs=2, join=True, start_method="spawn"
    )
    return {p: [torch.load(tmp / f"{p}{r}.pt") for r in range(2)] for p in EXCHANGED}


@pytest.fixture(scope="module")
def fp32_bytes(exchanges: dict[str, list[dict[str, Any]]]) -> int:
    results = exchanges["fp32"]
    want = _expected()
    for res in results:
        assert not res["errors"], res["errors"]
        for got, w in zip(res["tensors"], want, strict=True):
            assert float((got.double() - w).abs().max()) < 1e-5
    return sum(int(r["sent"]) + int(r["received"]) for r in results)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("precision", "tolerance", "ratio"), [("int8", 1e-4, 3.0), ("bf16", 1e-4, 1.9)]
)
def test_low_precision_exchange_agrees_and_moves_fewer_bytes(
    exchanges: dict[str, list[dict[str, Any]]],
    fp32_bytes: int,
    precision: str,
    tolerance: float,
    ratio: float,
) -> None:
    """Both trainers end within ``tolerance`` of the exact sums and move ``ratio`` x fewer bytes.

    A lost or double-counted update is >= 1e-3; the values span ~[-1, 1.3], so an exchange of
    values rather than changes would err by ~4e-3 (int8) -- the few rounds after the barrier
    send the residuals, which shrink 255x per round."""
    results = exchanges[precision]
    want = _expected()
    for r, res in enumerate(results):
        assert not res["errors"], res["errors"]
        for k, (got, w) in enumerate(zip(res["tensors"], want, strict=True)):
            err = float((got.double() - w).abs().max())
            assert err <= tolerance, (precision, r, NAMES[k], err)
        # the client's counts and the server's counts of the same messages agree
        other = results[1 - r]
        assert res["sent"] == other["server_received"]
        assert res["received"] == other["server_sent"]
    moved = sum(int(r["sent"]) + int(r["received"]) for r in results)
    assert fp32_bytes / moved >= ratio, (fp32_bytes, moved)


# ---------------------------------------------------------------------- config
def test_precision_config_key(tmp_path: Path) -> None:
    """``communication.precision``: fp32 by default, set with ``-p``, one of the codecs."""
    import json

    from bigembed.communication import PRECISIONS
    from bigembed.config import config_keys, load_config
    from bigembed.errors import ConfigError

    path = save_config(tmp_path, graph_config(tmp_path))
    assert load_config(path).communication.precision == "fp32"
    assert load_config(path, ["communication.precision=INT8"]).communication.precision == "int8"
    data = json.loads(path.read_text())
    data["communication"] = {"precision": "bf16"}
    path.write_text(json.dumps(data))
    assert load_config(path).communication.precision == "bf16"
    with pytest.raises(ConfigError, match=r"communication\.precision.*'fp32', .*'int8'"):
        load_config(path, ["communication.precision=int4"])
    keys = {key: kind for key, kind, _, _ in config_keys()}
    assert keys["communication.precision"] == "|".join(PRECISIONS)


# ---------------------------------------------------------------------- per segment, clamp
def test_segments_are_quantized_apart() -> None:
    """An accumulator segment's tiny deltas keep their own int8 scale next to a parameter
    segment's large ones (one chunk over both would err by ~10/510 = 0.02 on each of them)."""
    from bigembed.communication.segment_stream import SegmentStream

    rng = np.random.default_rng(0)
    big = torch.from_numpy(rng.uniform(-10, 10, 300).astype(np.float32))
    small = torch.from_numpy(rng.uniform(1e-6, 1e-4, 40).astype(np.float32))
    stream = SegmentStream(get_codec("int8"), [300, 40])
    wire = stream.encode(torch.cat([big, small]))
    got = SegmentStream(get_codec("int8"), [300, 40]).decode(wire)
    span = float(small.max() - small.min())
    assert float((got[300:] - small).abs().max()) <= span / 255 / 2 + 1e-9
    assert float((got[300:]).min()) >= 0
    assert float((got[:300] - big).abs().max()) <= 20 / 255 / 2 + 1e-5
    # one uint8 buffer: the codes, plus a float32 min and scale per (segment, chunk)
    assert wire.dtype == torch.uint8 and wire.numel() == stream.nbytes == 340 + 2 * 8


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_lossy_rounds_keep_accumulators_non_negative(precision: str) -> None:
    """The server's value may hold an accumulator a little below 0 (another trainer's decoded
    delta): with a lossy codec the trainer's live accumulator is clamped at 0 after the round,
    a parameter is not; fp32 applies the exact merged value, nothing else."""
    codec = get_codec(precision)
    shared = [torch.zeros(5), torch.zeros(5)]  # a parameter, its accumulator
    plan = ShardPlan(["param/w", "adagrad/w"], [5, 5], [0], nonnegative=[1])
    flat = [t.view(-1) for t in shared]
    server = ParameterServer(
        0, gather(flat, plan.segments[0]), [0], None, lambda m: None, codec, sizes=[5, 5]
    )
    server.value -= 1e-6  # what a quantized remote delta can leave near 0
    sharer = Sharer(0, plan, shared, server, None, lambda m: None, codec=codec)
    sharer._round()
    assert torch.equal(shared[0], torch.full((5,), -1e-6))
    if precision == "fp32":
        assert torch.equal(shared[1], torch.full((5,), -1e-6))  # exact, as before
    else:
        assert torch.equal(shared[1], torch.zeros(5))
        sharer._round()  # the clamp travels to the server like any change
        assert float(server.value[5:].abs().max()) < 1e-12


# ---------------------------------------------------------------------- end to end
NODES = 200


def _relations_graph(root: Path) -> dict[str, Any]:
    """node (4 partitions), relation p only in bucket (p, p): the shared parameters are the
    relation operators and their Adagrad state only, and each trainer's accumulator rows of the
    relations it has not trained yet sit at 0 while other rows move (the case that gave NaN
    when quantization pushed them below 0)."""

    rng = np.random.default_rng(1)
    parts = 4
    write_buckets(
        root,
        {"node": [NODES] * parts},
        [f"r{p}" for p in range(parts)],
        True,
        {(p, p): planted(rng, NODES, NODES, 8000, p) for p in range(parts)},
        (parts, parts),
    )
    return {"num_partitions": parts}


@pytest.mark.integration
@pytest.mark.parametrize(
    "make_graph", [write_items_graph, _relations_graph], ids=["items", "relations"]
)
def test_int8_training_matches_fp32_with_3x_fewer_bytes(
    tmp_path: Path, make_graph: Callable[[Path], dict[str, Any]]
) -> None:
    """``bigembed launch -n 2 -p communication.precision=int8``: the run finishes with finite
    values and accumulators >= 0, its withheld MRR is within 0.02 of the fp32 run's on the same
    graph and seed, and a sharer round moves >= 3x fewer bytes than with fp32."""
    graph = make_graph(tmp_path)
    dense = ("communication.sparse_rows=false",)  # the codecs alone (row-sparse: test_sparse_rows)
    int8, (int8_mrr, int8_auc), int8_bytes = launch_ranks(tmp_path, graph, "int8", overrides=dense)
    fp32, (fp32_mrr, fp32_auc), fp32_bytes = launch_ranks(tmp_path, graph, "fp32", overrides=dense)
    assert int8.keys() == fp32.keys()
    for name, got in int8.items():
        assert bool(torch.isfinite(got).all()), name
        assert got.shape == fp32[name].shape, name
        if "state" in name or "adagrad" in name:
            assert float(got.min()) >= 0, name
    assert fp32_auc > 0.95, fp32_auc  # the graph is learnt: the comparison means something
    assert int8_auc > 0.95, int8_auc
    assert abs(int8_mrr - fp32_mrr) <= 0.02, (int8_mrr, fp32_mrr)
    # per round (the number of rounds depends on timing); summed over both trainers, since
    # each trainer's remote server holds different tensors (the log lines come in any order)
    assert sum(fp32_bytes) / sum(int8_bytes) >= 3.0, (fp32_bytes, int8_bytes)
