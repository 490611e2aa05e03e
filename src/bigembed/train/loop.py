"""The training loop: epochs -> edge sets -> edge chunks -> buckets -> Hogwild batches.

:class:`TrainingLoop` runs the training algorithm and nothing else: each step (one chunk of one
edge set in one epoch) trains its buckets one after the other, each bucket's edges in Hogwild
batches by the worker pool, then saves and commits a checkpoint. It is composed of parts with
small interfaces, so that a mode is a composition, not a subclass:

* a :class:`BucketSource` hands out the buckets of a step
  (:class:`~bigembed.train.single_machine.LocalBucketSource`: the configured ``bucket_order``;
  distributed: the lock server);
* a :class:`~bigembed.train.memory.partitions.PartitionStore` is the partition source and sink
  (swapping to the checkpoint directory, or with a remote, to the partition servers);
* a :class:`~bigembed.train.policy.CheckpointPolicy` saves and commits each step;
* :class:`~bigembed.train.observers.TrainingObserver` s watch it (progress display,
  withheld-edge eval); the stats records go out through the policy's commit.

:mod:`bigembed.train.single_machine` is the single-machine composition;
:mod:`bigembed.distributed.trainer` builds the distributed one from the same loop.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from bigembed.buckets import bucket_sides, chunk_sizes, negative_settings, partitions_per_side
from bigembed.config import ConfigSchema
from bigembed.errors import InputError
from bigembed.kernels import KernelChoice, StepStats, choose_kernel
from bigembed.model import DtypeChoice, NegativeSettings, ScoringModel
from bigembed.partition_keys import Bucket, PartitionKey
from bigembed.train.evaluation import split_eval
from bigembed.train.growth import FROZEN_REASON, frozen_rows, new_edges
from bigembed.train.hogwild.gate import BatchGate
from bigembed.train.hogwild.pool import HogwildPool, WorkerSetup
from bigembed.train.iteration import Iteration, iterations, mix_seed
from bigembed.train.job import ModelState, TrainingJob
from bigembed.train.memory.edge_buffers import PreparedEdges
from bigembed.train.memory.partition_io import Job, PartitionIO
from bigembed.train.memory.partitions import PartitionStore
from bigembed.train.observers import (
    BucketWork,
    HeldOut,
    Observers,
    ProgressDisplay,
    StopTraining,
    TrainingObserver,
    WithheldEdgeEval,
)
from bigembed.train.policy import CheckpointPolicy
from bigembed.train.records import (
    BucketRecord,
    BucketTiming,
    EdgeStats,
    Position,
    StepLog,
    StepRecord,
)

__all__ = [
    "BucketSource",
    "EdgeShare",
    "Iteration",
    "StopTraining",
    "TrainResult",
    "TrainingLoop",
    "iterations",
    "standard_observers",
]

logger = logging.getLogger(__name__)

_mix = mix_seed  # the name tests know


class EdgeShare(Protocol):
    """One replica's share of a bucket's training edges (data-parallel training, where every
    replica trains the same bucket): see :class:`bigembed.train.replica_share.ReplicaShare`."""

    def prepare(
        self,
        it: Iteration,
        bucket: Bucket,
        pool: HogwildPool,
        edges: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
        seed: int,
    ) -> PreparedEdges:
        """This replica's batches of ``edges`` (the bucket's shuffled training edges, the same
        on every replica), prepared for ``pool``."""
        ...


class BucketSource(Protocol):
    """Hands out the buckets of one step (the lock server replaces this in distributed mode).

    The loop trains each bucket before it asks for the next one, so a source may act between
    two buckets (the lock client writes back and releases partitions there)."""

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]: ...


@dataclass
class TrainResult:
    version: int
    steps_run: int
    edges: int = 0
    seconds: float = 0.0
    last_step: StepRecord | None = None
    peak_partition_bytes: int = 0
    total_partition_bytes: int = 0
    stopped: str | None = None  # why an observer ended training early (None: it ran to the end)

    @property
    def edges_per_sec(self) -> float:
        return self.edges / self.seconds if self.seconds > 0 else 0.0


class TrainingLoop:
    """Runs steps ``start, start + 1, ...`` of a job with the parts it is given."""

    def __init__(
        self,
        job: TrainingJob,
        state: ModelState,
        *,
        buckets: BucketSource,
        partitions: PartitionStore,
        checkpoints: CheckpointPolicy,
        observers: Sequence[TrainingObserver] = (),
        gate: BatchGate | None = None,
        share: EdgeShare | None = None,
    ) -> None:
        """``gate``: passed by every worker before each batch (see
        :mod:`bigembed.train.hogwild.gate`); its owner can hold training back. ``share``: this
        replica's share of each bucket (data-parallel training), else every edge."""
        self.job = job
        self.cfg = job.cfg
        self.state = state
        self.bucket_source = buckets
        self.partitions = partitions
        self.checkpoints = checkpoints
        self.observers = Observers(observers)
        self.gate = gate
        self.share = share
        self._last_record: StepRecord | None = None
        self.kernel: KernelChoice | None = None  # decided when the run starts
        self.dtype: DtypeChoice | None = None  # the model's compute dtype, printed then
        #: the edge read-ahead thread (inline without ``partition_prefetch``)
        self._edge_io = PartitionIO(background=self.cfg.partition_prefetch)
        #: ``growth.edges: new``: the edges each bucket trains (None: all of them)
        self._new_edges = new_edges(job)

    def run(self, start: int) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(version=start, steps_run=0)
        result.total_partition_bytes = self.partitions.total_bytes()
        setup = WorkerSetup(
            self.state.model,
            self.state.adagrad,
            negative_settings(cfg),
            cfg.lr,
            cfg.resolved_relation_lr(),
            cfg.batch_size,
            cfg.dynamic_relations,
            self.gate,
            group_queries=cfg.train_type == "kvsall",
            frozen_rows=frozen_rows(cfg, self.job.entities),
            freeze_relations="relations" in cfg.growth.freeze,
        )
        # Decided once, here: the workers load the library it names and never decide again.
        self.kernel = setup.kernel = _choose_kernel(cfg.kernel, setup.model, setup.negs)
        self.dtype = setup.model.dtype_choice
        logger.info("%s", self.dtype.line())
        if setup.frozen_rows or setup.freeze_relations:
            self.kernel = setup.kernel = KernelChoice("eager", FROZEN_REASON)
        (logger.warning if self.kernel.degraded else logger.info)("%s", self.kernel.line())
        featurized = [t for t, e in cfg.entities.items() if e.featurized]
        if featurized and self.kernel.kernel == "native":
            logger.info(
                "batches of featurized types (%s) run on the eager step", ", ".join(featurized)
            )
        steal = cfg.load_balancing == "cost" or self.share is not None  # a share is planned
        pool = HogwildPool(setup, cfg.resolved_workers(), steal=steal)
        self.partitions.on_release = pool.forget
        started = time.perf_counter()
        finished = False
        try:
            for it in iterations(cfg.num_epochs, len(cfg.edge_paths), self.job.num_chunks, start):
                try:
                    step = self._run_step(it, pool)
                except StopTraining as stop:  # raised after the step's commit
                    result.stopped = str(stop)
                    assert self._last_record is not None
                    step = self._last_record
                result.steps_run += 1
                result.edges += step.stats.count
                result.version = it.version
                result.last_step = step
                if result.stopped is not None:
                    break
            finished = True
        finally:
            self._edge_io.close()
            pool.close(abandon=not finished)  # an error or interrupt: the step is thrown away
            self.partitions.close()
        result.seconds = time.perf_counter() - started
        result.peak_partition_bytes = self.partitions.peak_bytes
        return result

    def _run_step(self, it: Iteration, pool: HogwildPool) -> StepRecord:
        job, store, observers = self.job, self.partitions, self.observers
        store.advance(committed=it.index, working=it.version)
        sizes = chunk_sizes(job.edge_stores[it.edge_path_idx], it.chunk, job.num_chunks)
        observers.step_started(it, sum(sizes.values()))
        base_edges, base_loss = pool.progress()

        def training() -> None:
            edges, loss = pool.progress()
            observers.training(edges - base_edges, loss - base_loss)

        t0 = time.perf_counter()
        wait0 = store.io_wait_seconds
        gate0 = self.gate.wait_seconds() if self.gate is not None else 0.0
        peer0 = self.gate.peer_waited() if self.gate is not None else 0.0
        totals = StepStats()
        records: list[BucketRecord] = []
        grid = (partitions_per_side(self.cfg, "lhs"), partitions_per_side(self.cfg, "rhs"))
        buckets: Iterable[Bucket] = self.bucket_source.buckets(it, *grid)
        if getattr(self.bucket_source, "known_in_advance", False):
            buckets = [b for b in buckets if b in sizes]
            store.plan([self._keys(b) for b in buckets])
        # Edge read-ahead: the next bucket's edges are read, shuffled and planned in the
        # background while this one trains (when the buckets are known in advance).
        ahead: dict[Bucket, Job] = {}
        planned = buckets if isinstance(buckets, list) else None
        for k, bucket in enumerate(buckets):
            if bucket not in sizes:
                continue  # no edges
            bt = time.perf_counter()
            tables = store.ensure(self._keys(bucket))
            edges_job = ahead.pop(bucket, None) or self._edge_io.submit(
                functools.partial(self._prepare_edges, it, bucket, pool)
            )
            held_out, train_edges = edges_job.take()
            if self._edge_io.background and planned is not None and k + 1 < len(planned):
                following = planned[k + 1]
                ahead[following] = self._edge_io.submit(
                    functools.partial(self._prepare_edges, it, following, pool)
                )
            work = BucketWork(it, bucket, tables, bucket_sides(self.cfg, bucket), held_out)
            # The withheld-edge eval runs in the workers, as PBG's does.
            work.run_eval = functools.partial(
                pool.run_eval, work.tables, work.sides, on_wait=training
            )
            loaded = time.perf_counter()
            observers.bucket_started(work)
            started = time.perf_counter()  # the eval before the bucket is not the workers' time
            stats = pool.train(
                work.tables,
                work.sides,
                train_edges,
                on_wait=training,
                stagger=self.cfg.hogwild_delay if it.index == 0 and not records else 0.0,
            )
            trained = time.perf_counter()
            totals.add(stats)
            record = BucketRecord(_position(it), *bucket, len(records), _edge_stats(stats))
            record.timing = BucketTiming(loaded - bt, trained - started, pool.last_busy)
            observers.bucket_finished(work, record)
            record.seconds = time.perf_counter() - bt
            records.append(record)
            # Drop this bucket's tables now: held until the next ensure() returns, a partition
            # it swaps out would stay in memory beside the one it loads.
            del work, train_edges, tables
        training()

        self.checkpoints.save_step(it, store)
        step = StepRecord(
            _position(it),
            _edge_stats(totals),
            time.perf_counter() - t0,
            store.bytes_read,
            store.bytes_written,
            io_wait_seconds=store.io_wait_seconds - wait0,
        )
        if self.kernel is not None:
            step.kernel, step.kernel_reason = self.kernel.kernel, self.kernel.reason
        if self.dtype is not None:
            step.compute_dtype, step.compute_dtype_reason = self.dtype.name, self.dtype.reason
        if self.gate is not None:
            step.gate_wait_seconds = self.gate.wait_seconds() - gate0
            step.peer_wait_seconds = self.gate.peer_waited() - peer0
        if self.share is not None:
            step.mode = "data_parallel"
        observers.step_finished(step)
        # In a distributed run the committed record is every trainer's, merged: from here on
        # (summaries, early stopping, the result) the step is the run's, not this trainer's.
        step = self.checkpoints.commit_step(it, StepLog(records, step))
        self._last_record = step
        observers.step_committed(step)
        return step

    def _keys(self, bucket: Bucket) -> set[PartitionKey]:
        return {k for pair in bucket_sides(self.cfg, bucket) for k in pair}

    def _prepare_edges(
        self, it: Iteration, bucket: Bucket, pool: HogwildPool
    ) -> tuple[HeldOut | None, PreparedEdges]:
        """Load the bucket's chunk, withhold the eval edges (the same every epoch), shuffle the
        rest and have the pool plan them; returns the withheld edges and the edges to train.
        Runs in the edge read-ahead thread (``partition_prefetch``): it depends only on the
        seed, the iteration and the bucket, never on the tables or on the bucket before."""
        cfg, (i, j) = self.cfg, bucket
        store = self.job.edge_stores[it.edge_path_idx]
        chunk = store.load_chunk(i, j, it.chunk, self.job.num_chunks)
        lhs = torch.from_numpy(chunk.lhs.astype("int64", copy=False))
        rhs = torch.from_numpy(chunk.rhs.astype("int64", copy=False))
        rel = torch.from_numpy(chunk.rel.astype("int64", copy=False))
        if rel.numel() and int(rel.max()) >= self.job.num_relations:
            # stores imported before manifests recorded their relations (newer ones are
            # checked against the config when the job opens them)
            raise InputError(
                f"{store.path}: bucket ({i}, {j}) has relation id {int(rel.max())} but the "
                f"config has {self.job.num_relations} relation(s); was it imported with "
                "another config? re-run bigembed import"
            )
        weight = (
            None
            if chunk.weight is None
            else torch.from_numpy(chunk.weight.astype("float32", copy=False))
        )
        eval_seed = mix_seed(cfg.seed, 2, it.edge_path_idx, it.chunk, i, j)
        eval_idx, train_idx = split_eval(lhs.shape[0], cfg.eval_fraction, eval_seed)
        shuffle = torch.randperm(
            train_idx.shape[0],
            generator=torch.Generator().manual_seed(mix_seed(cfg.seed, 3, it.index, i, j)),
        )
        train_idx = train_idx[shuffle]
        if self._new_edges is not None:  # order kept: a subsequence of the shuffled edges
            replay_seed = mix_seed(cfg.seed, 7, it.index, i, j)
            sides = bucket_sides(cfg, bucket)
            train_idx = train_idx[
                self._new_edges.pick(
                    sides, lhs[train_idx], rhs[train_idx], rel[train_idx], replay_seed
                )
            ]
        held_out = None
        if eval_idx.numel() > 0:
            ew = None if weight is None else weight[eval_idx]
            held_out = HeldOut(lhs[eval_idx], rhs[eval_idx], rel[eval_idx], ew)
        tw = None if weight is None else weight[train_idx]
        seed = mix_seed(cfg.seed, 5, it.index, i, j) % (1 << 40)
        edges = (lhs[train_idx], rhs[train_idx], rel[train_idx], tw)
        if self.share is not None:  # the same edges on every replica: this one's share of them
            return held_out, self.share.prepare(it, bucket, pool, edges, seed)
        return held_out, pool.prepare(*edges, seed)


def _position(it: Iteration) -> Position:
    return Position(it.version, it.epoch, it.edge_path_idx, it.chunk)


def _edge_stats(stats: StepStats) -> EdgeStats:
    return EdgeStats.of_sums(
        stats.count, stats.loss, stats.reg, stats.violators_lhs, stats.violators_rhs
    )


def standard_observers(
    cfg: ConfigSchema,
    state: ModelState,
    num_chunks: int,
    progress: bool,
    report: Callable[[str], None] | None = None,
) -> list[TrainingObserver]:
    """The withheld-edge eval (if ``eval_fraction > 0``), then the progress display: live bars
    if ``progress``, and each committed step's summary line handed to ``report`` (the command
    prints it; library code does not print)."""
    out: list[TrainingObserver] = []
    if cfg.eval_fraction > 0:
        out.append(WithheldEdgeEval(cfg, state.model))
    if progress or report is not None:
        out.append(
            ProgressDisplay(
                cfg.num_epochs, len(cfg.edge_paths), num_chunks, bars=progress, report=report
            )
        )
    return out


#: Why ``compute_dtype: auto`` keeps fp32 where bf16 units exist but the native kernel applies.
NATIVE_FP32 = "auto: float32 for the native kernel (its small products are not the bottleneck)"


def _choose_kernel(requested: str, model: ScoringModel, negs: NegativeSettings) -> KernelChoice:
    """The run's kernel (``kernel: requested``). Where ``compute_dtype: auto`` chose bf16 and
    the native kernel, which runs fp32 only, could take the model's batches in fp32, fp32 and
    the native kernel win: it applies where a batch's products are small and the hundred
    small torch operations of the eager step dominate."""
    choice = model.dtype_choice
    if choice.auto and choice.name == "bfloat16" and requested != "eager":
        model.use_dtype(DtypeChoice("float32", NATIVE_FP32, auto=True))
        kernel = choose_kernel(requested, model, negs)
        if kernel.kernel == "native":
            return kernel
        model.use_dtype(choice)
    return choose_kernel(requested, model, negs)
