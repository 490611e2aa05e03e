"""Data-parallel training (``distributed_mode: data_parallel``): Bagua's and DGL-KE's model.

Every trainer is a replica: it walks the same buckets in the same order as the others (the
configured ``bucket_order``, drawn from the seed, as one machine would), trains its share of
each bucket's batches (:class:`~bigembed.train.replica_share.ReplicaShare`: Bagua's
load-balancing sampler over the batches' costs) and the communication strategy keeps every
parameter in step, entity tables included (:class:`~bigembed.distributed.replica_sync.ReplicaSync`).
A graph with one partition trains on every trainer, not on one.

Where the values live:

* rank 0's replica swaps to the checkpoint directory and writes the checkpoint, exactly as one
  machine does; the others swap to a private scratch directory of their own (created here,
  removed at the end), so no disk is shared and no partition crosses the network as a whole;
* at the start every trainer takes rank 0's values: the model and, when resuming (or warm
  starting from ``init_path``), every table, broadcast once; a fresh run's tables are the same
  everywhere already (seeded initialisation), which the first bucket's agreement checks;
* each step ends with :class:`ReplicaCheckpoints`: rank 0 saves and commits (with every
  trainer's stats merged), the others save into their scratch.

The partitioned mode (:mod:`bigembed.distributed.trainer`) stays the choice for tables that
do not fit one machine's memory budget; see docs/distributed.md.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from bigembed.checkpoints import CheckpointStore
from bigembed.config import ConfigSchema
from bigembed.distributed.context import DistContext
from bigembed.distributed.replica_sync import ReplicaSync
from bigembed.distributed.shared_checkpoint import (
    collect_step_logs,
    publish_step_log,
    share_merged_step,
)
from bigembed.distributed.shared_stop import SharedStop
from bigembed.kernels import Table
from bigembed.output_paths import StagingClaim, claim_staging, remove_dead_staging
from bigembed.storage import record_dependent
from bigembed.train import (
    Iteration,
    ModelState,
    PartitionStore,
    ReplicaShare,
    StepLog,
    StepRecord,
    Trainer,
    TrainingLoop,
    TrainResult,
    checkpoint_metadata,
    commit_with_stats,
    resume,
)

logger = logging.getLogger(__name__)


class ReplicaCheckpoints:
    """The data-parallel checkpoint policy: rank 0 writes and commits, the others keep their
    scratch copy current (the replicas are equal after every bucket)."""

    def __init__(
        self,
        ctx: DistContext,
        trainer: Trainer,
        store: CheckpointStore,
        net_bytes: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.job = trainer.job
        self.state = trainer.state
        self.store = store  # rank 0: the checkpoint; the others: their scratch
        self.net_bytes = net_bytes  # network bytes so far in this run
        self._reported = 0

    def save_step(self, it: Iteration, partitions: PartitionStore) -> None:
        partitions.flush()
        if self.ctx.rank == 0:
            self.store.save_model(it.version, self.state.payload())
            self.store.write_metadata(checkpoint_metadata(self.job, it))

    def commit_step(self, it: Iteration, log: StepLog) -> StepRecord:
        ctx = self.ctx
        assert ctx.store is not None
        version = it.version
        net = self.net_bytes()
        log.step.net_bytes = net - self._reported
        self._reported = net
        publish_step_log(ctx, version, log)
        ctx.barrier(f"v{version}/written")
        merged_step: StepRecord | None = None
        if ctx.rank == 0:
            merged = collect_step_logs(ctx, version)
            commit_with_stats(self.job, self.store, it, merged)
            step = merged.step
            logger.info(
                "step %d committed: %d edges by %d replicas, loss %.4f, %.0f edges/s, "
                "%.1f MB over the network, %.2f s at the gate (%.2f s waiting for slower replicas)",
                version,
                step.stats.count,
                ctx.layout.num_trainers,
                step.stats.loss,
                step.edges_per_sec,
                (step.net_bytes or 0) / 1e6,
                step.gate_wait_seconds or 0.0,
                step.peer_wait_seconds or 0.0,
            )
            merged_step = share_merged_step(ctx, version, step)
        else:
            self.store.commit(version)  # the scratch keeps one version
        ctx.barrier(f"v{version}/committed")
        return merged_step or share_merged_step(ctx, version, None)


class DataParallelTrainer:
    """One replica of a data-parallel run (see the module docstring)."""

    def __init__(
        self,
        cfg: ConfigSchema,
        ctx: DistContext,
        *,
        progress: bool = False,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx
        #: rank 0's verdicts on ending the run early (set before train() when the config
        #: has early_stopping), followed by every trainer
        self.stop: SharedStop | None = None
        self.rank = ctx.rank
        self.local = Trainer(cfg, progress=progress, report=report)
        self.job = self.local.job
        self.state: ModelState = self.local.state
        self.sync: ReplicaSync | None = None
        self.scratch: Path | None = None
        self._claim: StagingClaim | None = None

    def _open(self) -> tuple[CheckpointStore, int]:
        """Rank 0 opens the checkpoint; every trainer learns the committed version. The others
        get a scratch store of their own."""
        committed = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            store = self.local.checkpoint
            committed[0] = store.open_for_training()
            record_dependent(self.cfg.entity_path, store.path)  # `import --force` checks it
        else:
            self.scratch, self._claim = make_scratch(self.rank)
            self.ctx.on_exit(self._remove_scratch)  # also when the rank ends after a failure
            logger.info("replica %d keeps its swapped partitions in %s", self.rank, self.scratch)
            store = CheckpointStore(self.scratch)
            store.open_for_training()
        dist.broadcast(committed, src=0, group=self.ctx.trainer_group)
        return store, int(committed[0])

    def train(self) -> TrainResult:
        cfg, job, ctx = self.cfg, self.job, self.ctx
        store, committed = self._open()
        stopped = self.stop.at_start(committed) if self.stop is not None else None
        if stopped is not None:
            return TrainResult(version=committed, steps_run=0, stopped=stopped)
        if committed >= job.num_steps:
            if self.rank == 0:
                logger.info("training already complete (%d steps) in %s", job.num_steps, store.path)
            return TrainResult(version=committed, steps_run=0)
        init_source = resume(job, self.state, store, committed) if self.rank == 0 else None
        shared = cfg.resolved_workers() > 1
        partitions = self.local.open_partitions(committed, init_source, shared, checkpoint=store)
        if shared:
            self.state.move_to_shared_memory()
        self.sync = sync = ReplicaSync(ctx, self.state)
        if committed > 0 or cfg.init_path:  # a fresh run's tables are equal already (seeded)
            self._take_rank0_tables(partitions, store, committed)
        partitions.ensure(())  # the unpartitioned tables stay resident from now on
        sync.broadcast_start()
        checkpoints = ReplicaCheckpoints(ctx, self.local, store, sync.wire_bytes)
        loop = TrainingLoop(
            job,
            self.state,
            buckets=self.local.bucket_source,
            partitions=partitions,
            checkpoints=checkpoints,
            # the stop last: a step's summary line comes before the verdict after it
            observers=[sync, *self.local.observers, *([self.stop] if self.stop else [])],
            gate=sync.gate,
            share=ReplicaShare(
                job,
                ctx.layout.trainers.index(self.rank),
                ctx.layout.num_trainers,
                store=ctx.store,  # where the replicas take each other's batches (stealing)
            ),
        )
        return loop.run(committed)

    def _take_rank0_tables(
        self, partitions: PartitionStore, store: CheckpointStore, committed: int
    ) -> None:
        """Resuming or warm starting: every table of rank 0, broadcast one at a time, saved by
        the others into their scratch as the working version (where their store reads it)."""
        assert self.sync is not None
        for key in sorted(partitions.counts):
            etype, part = key
            count, dim = partitions.counts[key], partitions.dims[etype]
            if self.rank == 0:
                table = partitions.read(key)
            else:
                table = Table(torch.empty((count, dim)), torch.empty(count))
            self.sync.broadcast(table.emb)
            self.sync.broadcast(table.state)
            if self.rank != 0:
                store.save_partition(etype, part, committed + 1, table.emb, table.state)

    def net_bytes(self) -> int:
        return self.sync.wire_bytes() if self.sync is not None else 0

    def shutdown(self) -> None:
        """After the last checkpoint: wait for everybody, remove the scratch copy."""
        if self.sync is not None:
            logger.info(
                "replicas (%s, %s): %d rounds, %d bytes sent, %d received, %d repairs; changes %s",
                self.cfg.communication.strategy,
                self.cfg.communication.precision,
                self.sync.rounds,
                self.sync.bytes_sent,
                self.sync.bytes_received,
                self.sync.repairs,
                self.sync.merge,
            )
        self.ctx.barrier("end")
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None


#: Scratch directories are named ``bigembed-replica<R>-<random>`` in the temporary directory.
SCRATCH_PREFIX = "bigembed-replica"


def make_scratch(rank: int) -> tuple[Path, StagingClaim]:
    """A private scratch directory for replica ``rank``'s swapped partitions, in the system's
    temporary directory, claimed by this process (a locked marker, as an import's staging
    directories are: :func:`bigembed.output_paths.claim_staging`). Those of replicas that were
    killed before they could remove theirs are removed first: only directories with the name
    pattern and a marker whose process is gone."""
    base = Path(tempfile.gettempdir())
    for old in remove_dead_staging(base, [SCRATCH_PREFIX]):
        logger.info("removed %s (the scratch of a replica that ended without removing it)", old)
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{rank}-", dir=base))
    return path, claim_staging(path)
