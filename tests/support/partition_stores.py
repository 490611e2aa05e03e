"""Partition stores on their own (no trainer): a store that records its events and writes back
slowly, so reads and write-backs overlap, and a driver that takes a bucket order through it.

Shared by test_partition_buffer and test_edge_read_ahead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bigembed.checkpoints import CheckpointStore
from bigembed.kernels import Table
from bigembed.partition_keys import PartitionKey
from bigembed.train import PartitionStore


class SlowWriterStore(PartitionStore):
    """Records its events; every write-back takes a while, so reads overlap with it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, record_events=True, **kwargs)  # type: ignore[arg-type]
        SlowWriterStore.last = self

    last: SlowWriterStore

    def _save(self, key: PartitionKey, table: Table) -> None:
        time.sleep(0.02)
        super()._save(key, table)


def small_store(
    path: Path, nparts: int, rows: int, kind: type[PartitionStore] = SlowWriterStore, **options: Any
) -> PartitionStore:
    """A fresh run's store (version 1, nothing committed) of ``nparts`` partitions of ``rows``
    rows of one type at d=4, in private memory; ``options``: capacity, background, remote..."""
    return kind(
        {("node", p): rows for p in range(nparts)},
        {"node": 4},
        CheckpointStore(path),
        committed=0,
        working=1,
        init_source=None,
        init_scale=0.1,
        seed=1,
        shared=False,
        **options,
    )


def swapping_store(tmp_path: Path, capacity: int, background: bool) -> PartitionStore:
    """A :class:`SlowWriterStore` of 8 partitions of 50 rows that holds ``capacity`` of them."""
    return small_store(
        tmp_path / f"ck{capacity}{background}", 8, 50, capacity=capacity, background=background
    )


def run_order(store: PartitionStore, order: list[tuple[int, int]]) -> None:
    """Plan and take ``order``'s buckets on ``store``, adding 1 to every table taken (so a
    value read back shows whether the write-back before it was complete), then flush."""
    keys = [{("node", i), ("node", j)} for i, j in order]
    store.plan(keys)
    for k in keys:
        tables = store.ensure(k)
        for t in tables.values():
            t.emb.add_(1.0)  # "training": the value read back must carry it
    store.flush()
