"""Edge read-ahead and what the Hogwild workers keep (issue 11).

* With ``partition_prefetch`` on, a bucket's edges are read (and shuffled, and planned) in the
  background, never in the training thread; the edges each bucket trains, and their order, are
  exactly those of a run without read-ahead (same seed).
* The workers keep the tables and edge buffers they were sent: a table used by the next
  bucket again is named by its token, not re-sent; the edge buffers are reused.
* A table the partition store evicts is dropped by every worker (it no longer maps it) before
  the store counts it as freed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.kernels.step import Table
from bigembed.storage import EdgeStore
from bigembed.train.hogwild.pool import ACK, HogwildPool, WorkerSetup
from bigembed.train.memory.edge_buffers import PreparedEdges
from bigembed.train.single_machine import Trainer
from support.graphs import graph_config, write_graph
from support.partition_stores import run_order, swapping_store

NPARTS = 4


def _trained_edges(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch, prefetch: bool, workers: int
) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """Per bucket trained, in order: (seed, lhs, rhs, rel, plan); and, per chunk read,
    whether it was read in the main (training) thread."""
    trained: list[tuple[Any, ...]] = []
    in_main: list[bool] = []
    train, load_chunk = HogwildPool.train, EdgeStore.load_chunk

    def recording_train(
        self: HogwildPool, tables: Any, sides: Any, edges: PreparedEdges, *a: Any, **k: Any
    ) -> Any:
        plan = None if edges.plan is None else edges.plan.copy()
        trained.append((edges.seed, edges.lhs.clone(), edges.rhs.clone(), edges.rel.clone(), plan))
        return train(self, tables, sides, edges, *a, **k)

    def recording_load(self: EdgeStore, *args: Any, **kwargs: Any) -> Any:
        in_main.append(threading.current_thread() is threading.main_thread())
        return load_chunk(self, *args, **kwargs)

    monkeypatch.setattr(HogwildPool, "train", recording_train)
    monkeypatch.setattr(EdgeStore, "load_chunk", recording_load)
    cfg = graph_config(
        tmp_path,
        checkpoint_path=str(tmp_path / name),
        num_partitions=NPARTS,
        num_epochs=2,
        bucket_order="buffer",
        seed=7,
        workers=workers,
        batch_size=100,
        partition_prefetch=prefetch,
    )
    Trainer(cfg, progress=False, capacity=3).train()
    monkeypatch.undo()
    return trained, in_main


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.integration)])
def test_read_ahead_reads_edges_off_the_training_thread_and_trains_the_same_edges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    write_graph(tmp_path, num_entities=400, num_edges=4000, num_partitions=NPARTS, seed=2)
    ahead, ahead_main = _trained_edges(tmp_path, "ahead", monkeypatch, True, workers)
    inline, inline_main = _trained_edges(tmp_path, "inline", monkeypatch, False, workers)

    assert len(ahead) == len(inline) == 2 * NPARTS * NPARTS
    assert len(ahead_main) == len(ahead) and not any(ahead_main), "edges read in training thread"
    assert all(inline_main), "without read-ahead the training thread reads the edges"
    # With read-ahead the buffer order is the staggered one, so the buckets may come in another
    # order; each bucket of each epoch (its seed) must train the same edges in the same order.
    by_seed = {a[0]: a for a in ahead}
    assert len(by_seed) == len(ahead) and set(by_seed) == {b[0] for b in inline}
    for b in inline:
        a = by_seed[b[0]]
        for x, y in zip(a[1:4], b[1:4], strict=True):
            assert torch.equal(x, y), f"bucket seed {b[0]}: other edges or another order"
        assert (a[4] is None) == (b[4] is None) and (a[4] is None or np.array_equal(a[4], b[4]))
        if workers > 1:
            assert a[4] is not None, "work stealing plans the batches"


def _pool(workers: int = 2) -> HogwildPool:
    from bigembed.buckets.negative_settings import negative_settings
    from bigembed.config import model_spec
    from bigembed.model.scoring import ScoringModel

    cfg = graph_config(Path("/nonexistent"), dimension=8, batch_size=50)
    model = ScoringModel(model_spec(cfg, 3))
    model.share_memory()
    states = [torch.zeros_like(p).share_memory_() for p in model.parameters()]
    setup = WorkerSetup(model, states, negative_settings(cfg), 0.1, 0.1, 50, False)
    return HogwildPool(setup, workers, steal=True)


def _table(n: int = 100) -> Table:
    return Table(torch.randn(n, 8).share_memory_(), torch.zeros(n).share_memory_())


def _edges(seed: int, n: int = 300) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(100, (n,), generator=gen),
        torch.randint(100, (n,), generator=gen),
        torch.randint(3, (n,), generator=gen),
    )


def _inode(t: torch.Tensor) -> int:
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def _mapped_inodes(pid: int) -> set[int]:
    out = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4].isdigit():
            out.add(int(fields[4]))
    return out


@pytest.mark.integration
def test_workers_keep_what_they_were_sent_and_drop_an_evicted_table_before_it_is_freed() -> None:
    pool = _pool()
    sent: list[Any] = []
    for q in pool._tasks:
        put = q.put

        def recording_put(msg: Any, put: Any = put) -> None:
            sent.append(msg)
            put(msg)

        q.put = recording_put  # type: ignore[method-assign]
    try:
        a, b = ("node", 0), ("node", 1)
        tables = {a: _table(), b: _table()}
        sides = [(a, b)] * 3
        for bucket in range(4):
            sent.clear()
            lhs, rhs, rel = _edges(bucket)
            stats = pool.run(tables, sides, lhs, rhs, rel, None, 7 + bucket)
            assert stats.count == 300
            handles = [h for m in sent for h in [*m.tables.values(), m.edges]]
            if bucket == 0:
                assert all(h.value is not None for h in handles)
            else:
                assert all(h.value is None for h in handles), f"bucket {bucket} re-sent"
        assert pool.buffers.allocated == 1, "the edge buffer is reused"

        pids = [p.pid for p in pool._procs if p.pid is not None]
        assert len(pids) == 2
        ino_a, ino_b = _inode(tables[a].emb), _inode(tables[b].emb)
        for pid in pids:
            assert {ino_a, ino_b} <= _mapped_inodes(pid), "the workers keep the tables"
        evicted = tables.pop(a)
        wait = pool.forget(a, evicted)
        wait()
        assert pool.board[:, ACK].min() >= 1, "the wait returned before the workers dropped it"
        for pid in pids:
            mapped = _mapped_inodes(pid)
            assert ino_a not in mapped, "a worker still maps the evicted table"
            assert ino_b in mapped
    finally:
        pool.close()


def test_the_store_counts_a_table_freed_only_after_its_release(tmp_path: Path) -> None:
    """The write-back calls what ``on_release`` returned (the workers' drop) after writing the
    table and before the table leaves the count of tables alive."""
    store = swapping_store(tmp_path, capacity=2, background=True)
    assert store.events is not None
    events = store.events
    store.on_release = lambda key, table: lambda: events.append(("released", key))
    run_order(store, [(0, 1), (2, 3), (0, 2), (1, 3)])
    store.drain()
    queued = [k for kind, k in events if kind == "write_queued"]
    assert queued, "it swapped"
    for key in queued:
        released = [i for i, e in enumerate(events) if e == ("released", key)]
        ended = [i for i, e in enumerate(events) if e == ("write_end", key)]
        assert released and ended and released[0] < ended[0], f"{key}: freed before released"


@pytest.mark.parametrize("weighted", [False, True])
def test_a_buffer_holds_a_plan_that_takes_every_edge_twice(weighted: bool) -> None:
    """A grouped-query plan (``train_type: KvsAll``) takes each edge once per side: the buffer
    holds ``len(order)`` rows, not the edge count (it once held the edge count, and the copy
    into the too-short shared buffer crashed the process)."""
    from bigembed.train.memory.edge_buffers import EdgeBuffers

    gen = torch.Generator().manual_seed(0)
    n = 1000
    edges = (
        torch.randint(50, (n,), generator=gen),
        torch.randint(50, (n,), generator=gen),
        torch.zeros(n, dtype=torch.int64),
        torch.rand(n, generator=gen) if weighted else None,
    )
    order = torch.cat([torch.randperm(n, generator=gen), torch.randperm(n, generator=gen)])
    prepared = EdgeBuffers().fill(edges, order, 7, None)
    assert prepared.count == 2 * n
    got_all = (prepared.lhs, prepared.rhs, prepared.rel, prepared.weight)
    for got, src in zip(got_all, edges, strict=True):
        if src is None:
            assert got is None
        else:
            assert got is not None and torch.equal(got, src[order])
