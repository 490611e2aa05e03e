"""Training on one machine: the training loop with the local parts.

:class:`Trainer` composes :class:`~bigembed.train.loop.TrainingLoop` with the configured bucket
order (:class:`LocalBucketSource`), a partition store swapping to this run's checkpoint
directory and sized by the memory budget (:mod:`bigembed.train.memory.budget`), and the local
checkpoint policy (:class:`~bigembed.train.policy.LocalCheckpoints`). :func:`train` is what
``bigembed train`` runs without ``--rank``.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from bigembed.buckets import bucket_sides, chunk_sizes, partitions_per_side
from bigembed.checkpoints import CheckpointStore
from bigembed.config import ConfigSchema
from bigembed.partition_keys import Bucket
from bigembed.storage import record_dependent
from bigembed.train.growth import grow_checkpoint, pending_extension
from bigembed.train.iteration import Iteration, mix_seed
from bigembed.train.job import ModelState, TrainingJob
from bigembed.train.loop import BucketSource, TrainingLoop, TrainResult, standard_observers
from bigembed.train.memory.bucket_order import bucket_order
from bigembed.train.memory.budget import MemoryPlan, plan_memory
from bigembed.train.memory.partitions import PartitionSource, PartitionStore
from bigembed.train.observers import TrainingObserver
from bigembed.train.policy import LocalCheckpoints, resume
from bigembed.writer_lock import hold

logger = logging.getLogger(__name__)


class LocalBucketSource:
    """The configured ``bucket_order``, drawn anew each step from the seed. ``buffer``: the
    partitions per side the ``buffer`` order plans for; ``read_ahead``: the partition store
    reads ahead in the background (``partition_prefetch``), so ``buffer`` is the staggered
    order (see :func:`bigembed.train.memory.bucket_order.bucket_order`). Its buckets are known in
    advance, so the loop plans the partition store's evictions and read-ahead with them."""

    known_in_advance = True

    def __init__(self, order: str, seed: int, buffer: int = 2, read_ahead: bool = False) -> None:
        self.order = order
        self.seed = seed
        self.buffer = buffer
        self.read_ahead = read_ahead

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]:
        rng = random.Random(mix_seed(self.seed, 1, it.index))
        yield from bucket_order(
            self.order, nparts_lhs, nparts_rhs, rng, self.buffer, self.read_ahead
        )


class Trainer:
    """Single-machine training: the loop with the local parts (see the module docstring).

    ``partitions_type`` is the :class:`PartitionStore` class to build (tests pass one that never
    swaps); ``observers`` come after the standard ones; ``capacity`` replaces the partitions
    the memory budget holds (tests).
    """

    def __init__(
        self,
        cfg: ConfigSchema,
        *,
        progress: bool = True,
        report: Callable[[str], None] | None = None,
        bucket_source: BucketSource | None = None,
        partitions_type: type[PartitionStore] = PartitionStore,
        observers: Sequence[TrainingObserver] = (),
        capacity: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.job = TrainingJob(cfg)
        self._capacity = capacity
        self.edge_stores = self.job.edge_stores
        self.checkpoint = CheckpointStore(cfg.checkpoint_path)
        self.memory = self._memory_plan()
        self.bucket_source = bucket_source or LocalBucketSource(
            cfg.bucket_order,
            cfg.seed,
            buffer=self._order_buffer(),
            read_ahead=cfg.partition_prefetch,
        )
        self.partitions_type = partitions_type
        self.state = ModelState.build(self.job)
        self.observers = [
            *standard_observers(cfg, self.state, self.job.num_chunks, progress, report),
            *observers,
        ]

    def train(self) -> TrainResult:
        with training_locks(self.cfg):
            return self._train()

    def _train(self) -> TrainResult:
        cfg, job = self.cfg, self.job
        checkpoints = LocalCheckpoints(job, self.state, self.checkpoint)
        committed = self.checkpoint.open_for_training()
        record_dependent(cfg.entity_path, self.checkpoint.path)  # `import --force` checks it
        if committed >= job.num_steps:
            logger.info(
                "training already complete (%d steps) in %s", job.num_steps, self.checkpoint.path
            )
            if committed > 0 and pending_extension(
                job.entities, self.checkpoint.read_metadata(committed)
            ):
                logger.warning(
                    "%s was extended with new entities since this model was trained; raise "
                    "num_epochs to train them (-p num_epochs=...)",
                    cfg.entity_path,
                )
            return TrainResult(version=committed, steps_run=0)
        grown = grow_checkpoint(job, self.checkpoint, committed)
        init_source = resume(job, self.state, self.checkpoint, committed, grown=grown is not None)
        shared = cfg.resolved_workers() > 1
        partitions = self.open_partitions(committed, init_source, shared)
        if shared:
            self.state.move_to_shared_memory()
        loop = TrainingLoop(
            job,
            self.state,
            buckets=self.bucket_source,
            partitions=partitions,
            checkpoints=checkpoints,
            observers=self.observers,
        )
        return loop.run(committed)

    def _memory_plan(self) -> MemoryPlan:
        """How many partitions this run holds (see :mod:`bigembed.train.memory.budget`)."""
        cfg, job = self.cfg, self.job
        counts, dims = job.partition_counts(), job.dimensions()
        pinned = set(job.unpartitioned(counts))
        size = {k: n * (dims[k[0]] + 1) * 4 for k, n in counts.items()}
        per_bucket = max(
            (
                len({job.table_key(k) for pair in bucket_sides(cfg, (i, j)) for k in pair} - pinned)
                for i in range(partitions_per_side(cfg, "lhs"))
                for j in range(partitions_per_side(cfg, "rhs"))
            ),
            default=0,
        )
        max_edges = max(
            (
                max(chunk_sizes(store, c, job.num_chunks).values(), default=0)
                for store in job.edge_stores
                for c in range(job.num_chunks)
            ),
            default=0,
        )
        plan = plan_memory(
            cfg.memory_budget,
            [b for k, b in size.items() if k not in pinned],
            sum(size[k] for k in pinned),
            max_edges,
            cfg.resolved_workers(),
            per_bucket,
            read_ahead=cfg.partition_prefetch,
        )
        if self._capacity is not None:
            plan = replace(plan, capacity=max(self._capacity, per_bucket))
        logger.info("%s", plan.describe())
        return plan

    def _order_buffer(self) -> int:
        """Partition indices per side the bucket order plans for: as many as the capacity
        holds, in the unit a swap moves (one table per partitioned entity type). With
        read-ahead, the staggered ``buffer`` order reads the next partition into the slot the
        leaving one frees, so no slot is kept for it. A featurized type's partitions share one
        resident feature table: they take no slot."""
        types = {
            t for t, e in self.cfg.entities.items() if e.num_partitions > 1 and not e.featurized
        }
        return max(2, self.memory.capacity // max(len(types), 1))

    def open_partitions(
        self,
        committed: int,
        init_source: PartitionSource | None,
        shared: bool,
        checkpoint: CheckpointStore | None = None,
    ) -> PartitionStore:
        """The partition store of a run resumed at ``committed``, swapping to ``checkpoint``
        (default: this run's; a data-parallel replica swaps to its own scratch store)."""
        counts = self.job.partition_counts()
        store = self.partitions_type(
            counts,
            self.job.dimensions(),
            checkpoint or self.checkpoint,
            committed=committed,
            working=committed + 1,
            init_source=init_source,
            init_scale=self.cfg.init_scale,
            seed=self.cfg.seed,
            shared=shared,
            pinned=self.job.unpartitioned(counts),
            capacity=self.memory.capacity,
            background=self.cfg.partition_prefetch,
        )
        store.bags = self.job.feature_bags(shared)
        return store


@contextlib.contextmanager
def training_locks(cfg: ConfigSchema, *, writes: bool = True) -> Iterator[None]:
    """What a training holds for its whole life (:mod:`bigembed.writer_lock`): its checkpoint
    directory exclusively when it ``writes`` it (one writer per directory), and the entity and
    edge stores it reads shared, so that no import replaces them under it."""
    with contextlib.ExitStack() as held:
        if writes:
            held.enter_context(hold(cfg.checkpoint_path, "training"))
        for store in dict.fromkeys([cfg.entity_path, *cfg.edge_paths]):
            held.enter_context(hold(store, "training", shared=True))
        yield


def train(
    cfg: ConfigSchema, *, progress: bool = True, report: Callable[[str], None] | None = None
) -> TrainResult:
    """Train (or resume training) as the config says; returns a summary.

    ``progress`` draws live bars; ``report`` receives one summary line per committed step.
    """
    return Trainer(cfg, progress=progress, report=report).train()
