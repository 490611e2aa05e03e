"""Strategies driven over a real gloo group the way a trainer drives them, for the tests of
Bagua's cells (test_gossip, test_overlap, test_hierarchical).

:func:`spawn` starts ``world`` processes running a module-level function ``fn(rank, world,
store, out, *args)``, which calls :func:`drive` once per case and saves each result with
:func:`save`; :func:`load` reads them back. :func:`drive` is test_strategies' trainer loop with
knobs: buckets of ``batches`` "batches" that each add this rank's fixed increments to the shared
tensors, an optional sleep per batch, extra :class:`StrategyEnv` fields, and a hook on the made
strategy (to slow its network down, say); then flush, barrier, agree, stop.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAMES = ["param/a", "adagrad/a", "emb/item", "emb_state/item"]
NUMELS = [300, 300, 40_000, 5_000]
NONNEGATIVE = frozenset({1, 3})


def increments(rank: int, steps: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per batch, per tensor: (indices, values) this rank adds (values > 0)."""
    rng = np.random.default_rng(10 + rank)
    return [
        [
            (
                torch.from_numpy(rng.integers(0, n, 50)),
                torch.from_numpy(rng.random(50).astype(np.float32) * 1e-2 + 1e-3),
            )
            for n in NUMELS
        ]
        for _ in range(steps)
    ]


def initial() -> list[torch.Tensor]:
    return [torch.linspace(0, 1, n) for n in NUMELS]


def expected(world: int, steps: int, *, mean: bool) -> list[torch.Tensor]:
    """initial + every rank's increments (summed, or divided by ``world``), in float64."""
    total = [torch.zeros(n, dtype=torch.float64) for n in NUMELS]
    for rank in range(world):
        for step in increments(rank, steps):
            for w, (idx, val) in zip(total, step, strict=True):
                w.index_add_(0, idx, val.double())
    scale = 1.0 / world if mean else 1.0
    return [t.double() + scale * w for t, w in zip(initial(), total, strict=True)]


def spread(per_rank: list[list[torch.Tensor]]) -> float:
    """How far the ranks' values are from their mean (the largest difference)."""
    mean = [sum(ts) / len(ts) for ts in zip(*per_rank, strict=True)]
    return max(float((t - m).abs().max()) for ts in per_rank for t, m in zip(ts, mean, strict=True))


def alone(world: int, steps: int) -> list[list[torch.Tensor]]:
    """Every rank's values had nobody exchanged anything."""
    values = [initial() for _ in range(world)]
    for rank, tensors in enumerate(values):
        for step in increments(rank, steps):
            for t, (idx, val) in zip(tensors, step, strict=True):
                t.index_add_(0, idx, val)
    return values


def drive(
    rank: int,
    world: int,
    side: Any,
    strategy: str,
    precision: str,
    *,
    buckets: int = 2,
    batches: int = 12,
    sync_every: int = 4,
    batch_sleep: Callable[[int], float] = lambda rank: 0.0,
    store: str | None = None,
    env: dict[str, Any] | None = None,
    hook: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """One trainer's part of a strategy's run; returns what the checks read."""
    import torch.distributed as dist

    from bigembed.communication import get_codec
    from bigembed.communication.strategies import SharedTensors, StrategyEnv, make_strategy

    errors: list[str] = []

    def on_error(message: str) -> None:
        errors.append(message)
        print(message, file=sys.stderr)

    tensors = initial() if rank == 0 else [torch.zeros(n) for n in NUMELS]
    for t in tensors:
        dist.broadcast(t, src=0)
    extra = dict(env or {})
    if store is not None:
        extra["store_client"] = lambda: dist.FileStore(store, -1)
    strategy_env = StrategyEnv(
        rank=rank,
        trainers=list(range(world)),
        group=None,
        codec=get_codec(precision),
        workers=1,
        sync_every=sync_every,
        sync_interval=0.01,
        on_error=on_error,
        **extra,
    )
    s = make_strategy(strategy, strategy_env, SharedTensors(NAMES, tensors, NONNEGATIVE))
    if hook is not None:
        hook(s)
    s.start()
    lag: list[int] = []  # per batch: batches past the last completed round's start
    steps = increments(rank, buckets * batches)
    started = time.monotonic()
    batch = 0
    for bucket in range(buckets):
        s.bucket_started()
        for b in range(batches):
            if s.gate is not None:
                s.gate.wait_turn()
            done = getattr(getattr(s, "rounds_thread", None), "_completed_batches", None)
            lag.append(batch - done if done is not None else -1)
            for t, (idx, val) in zip(tensors, steps[bucket * batches + b], strict=True):
                t.index_add_(0, idx, val)
            time.sleep(batch_sleep(rank))
            if s.gate is not None:
                s.gate.passed(0)
            batch += 1
        s.bucket_finished()
    trained_s = time.monotonic() - started
    s.flush(30)
    dist.barrier(group=side)
    before = [t.clone() for t in tensors]  # what the rounds did, before the exact agreement
    s.agree(30)
    dist.barrier(group=side)
    reduce = getattr(getattr(s, "data", None), "reduce", None)
    result = {
        "tensors": [t.clone() for t in tensors],
        "before": before,
        "errors": errors,
        "lag": lag,
        "rounds": s.rounds,
        "sent": s.bytes_sent,
        "received": s.bytes_received,
        "sent_to": dict(getattr(reduce, "sent_to", {})),
        "reduce": type(reduce).__name__,
        "trained_s": trained_s,
        "log": list(getattr(s, "test_log", [])),  # what a hook recorded
    }
    s.stop()
    return result


WRITES = threading.Lock()  # the test trainer's writes and the rounds' applies


def serialize_writes() -> None:
    """Make every write of a round to the live tensors take :data:`WRITES` (a spawned test
    process calls it once; its trainer loop writes under the same lock).

    The asynchronous strategies apply a round to the live tensors while the trainer writes them,
    as Hogwild workers do: two read-modify-writes of one float at the same instant lose one of
    the two changes. Training accepts that race by design, an exact test cannot; with the lock,
    what is checked exactly is the protocol (a change made while a round is in flight, between
    its snapshot and its apply, is kept and goes out with the next round)."""
    from bigembed.communication import delta_reduce, sharer, sparse_reduce, sparse_sharer

    def locked(apply: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kw: Any) -> None:
            with WRITES:
                apply(*args, **kw)

        return run

    sharer.scatter_add = locked(sharer.scatter_add)
    delta_reduce.scatter_add = locked(delta_reduce.scatter_add)
    sparse_sharer.RowSharer._apply = locked(sparse_sharer.RowSharer._apply)  # type: ignore[method-assign]
    sparse_reduce.RowReduce._apply = locked(sparse_reduce.RowReduce._apply)  # type: ignore[method-assign]


def init(rank: int, world: int, store: str) -> Any:
    """Join the gloo group of a spawned test process; returns a side group for barriers."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    return dist.new_group(backend="gloo")


def save(out: str, case: str, rank: int, result: dict[str, Any]) -> None:
    torch.save(result, os.path.join(out, f"{case}-{rank}.pt"))


def load(where: Path, case: str, world: int) -> list[dict[str, Any]]:
    return [torch.load(where / f"{case}-{r}.pt") for r in range(world)]


def spawn(fn: Callable[..., None], world: int, where: Path, *args: Any) -> None:
    """Run ``fn(rank, world, store, out, *args)`` in ``world`` spawned processes."""
    import torch.multiprocessing as mp

    mp.start_processes(
        fn,
        args=(world, str(where / "store"), str(where), *args),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
