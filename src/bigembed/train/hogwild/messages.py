"""What the trainer and its Hogwild workers exchange: the setup, the tasks and the shared queue.

The trainer (:mod:`bigembed.train.hogwild.pool`) sends each worker
(:mod:`bigembed.train.hogwild.worker`) a :class:`WorkerSetup` once, then per bucket a
:class:`BucketMessage` or an :class:`EvalMessage` whose tables and edges travel as handles (each
shared-memory object sent once, then named by a token: :mod:`bigembed.train.hogwild.cache`); the
worker resolves a message into its task. Work stealing goes through the :class:`BatchQueue`, and
progress through a shared board whose columns are named here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from bigembed.kernels import EAGER, KernelChoice, Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.partition_keys import PartitionKey
from bigembed.ranking import EvalPlan
from bigembed.train.hogwild.cache import Handle, WorkerCache
from bigembed.train.hogwild.gate import BatchGate
from bigembed.train.memory.edge_buffers import EdgeBuffer

#: Columns of the progress board (one row per worker): edges trained, their summed loss,
#: seconds spent training tasks, and the last acknowledged drop's sequence number.
EDGES, LOSS, BUSY, ACK = 0, 1, 2, 3
BOARD_COLUMNS = 4


@dataclass
class WorkerSetup:
    """What every worker needs for the whole run (sent once, as the first message)."""

    model: ScoringModel
    model_states: list[Tensor]
    negs: NegativeSettings
    lr: float
    relation_lr: float
    batch_size: int
    dynamic: bool
    gate: BatchGate | None = None  # passed before every batch (synchronous strategies)
    group_queries: bool = False  # train_type: KvsAll (see bigembed.buckets.batching)
    kernel: KernelChoice = EAGER  # the trainer's choice: the workers do not decide again
    # growth.freeze: leading rows per partition no step may change; dense parameters frozen
    frozen_rows: dict[PartitionKey, int] = field(default_factory=dict)
    freeze_relations: bool = False


@dataclass
class BucketTask:
    """One worker's share of a bucket."""

    tables: dict[PartitionKey, Table]
    sides: list[tuple[PartitionKey, PartitionKey]]  # per relation idx: (lhs table, rhs table)
    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None
    start: int
    end: int
    seed: int
    delay: float = 0.0  # seconds to wait before starting (PBG's hogwild_delay)
    # Work stealing: the bucket's batch plan (see batch_plan) over edges already put in plan
    # order, so batch k is rows plan[k, 0]:plan[k, 1]; start/end are then unused. A small
    # array sent by value (one more shared-memory tensor per task costs more than it).
    plan: np.ndarray | None = None
    # One worker only: the plan rows to train, in this order (replicas taking each other's
    # batches), instead of every row in plan order.
    claims: Iterable[int] | None = None


@dataclass
class BucketMessage:
    """A :class:`BucketTask` as sent to a worker: the tables and the edge buffer as handles,
    the edges being the first ``count`` rows."""

    tables: dict[PartitionKey, Handle[Table]]
    sides: list[tuple[PartitionKey, PartitionKey]]
    edges: Handle[EdgeBuffer]
    count: int
    start: int
    end: int
    seed: int
    delay: float
    plan: np.ndarray | None

    def resolve(self, cache: WorkerCache) -> BucketTask:
        buf = cache.resolve(self.edges)
        n = self.count
        return BucketTask(
            {k: cache.resolve(h) for k, h in self.tables.items()},
            self.sides,
            buf.lhs[:n],
            buf.rhs[:n],
            buf.rel[:n],
            None if buf.weight is None else buf.weight[:n],
            self.start,
            self.end,
            self.seed,
            self.delay,
            self.plan,
        )


@dataclass
class EvalTask:
    """A withheld-edge eval for the workers: the units of ``plan`` (see
    :class:`~bigembed.ranking.sampled.EvalPlan`), taken from the batch queue (work
    stealing) or, without it, every ``workers``-th unit from the worker's rank."""

    tables: dict[PartitionKey, Table]
    sides: list[tuple[PartitionKey, PartitionKey]]
    plan: EvalPlan
    workers: int


@dataclass
class EvalMessage:
    """An :class:`EvalTask` as sent to a worker (the tables as handles)."""

    tables: dict[PartitionKey, Handle[Table]]
    sides: list[tuple[PartitionKey, PartitionKey]]
    plan: EvalPlan
    workers: int

    def resolve(self, cache: WorkerCache) -> EvalTask:
        tables = {k: cache.resolve(h) for k, h in self.tables.items()}
        return EvalTask(tables, self.sides, self.plan, self.workers)


class BatchQueue:
    """The shared queue of a bucket's planned batches: a counter in shared memory.

    ``take`` hands out 0, 1, 2, ... exactly once each across all processes (the counter's lock
    makes read-and-increment atomic); ``reset`` starts a new bucket (only while no worker is
    taking). Passed to the workers as a process argument (a lock cannot travel in a queue).
    """

    def __init__(self, ctx: Any) -> None:
        self._next = ctx.Value("q", 0, lock=True)

    def take(self) -> int:
        with self._next.get_lock():
            k = int(self._next.value)
            self._next.value = k + 1
        return k

    def reset(self) -> None:
        with self._next.get_lock():
            self._next.value = 0
