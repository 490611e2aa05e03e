"""The distributed trainer: the single-machine loop composed with distributed parts.

:class:`DistributedTrainer` builds the same :class:`~bigembed.train.loop.TrainingLoop` as one
machine does, from different parts:

* buckets come from the lock server (:class:`~bigembed.distributed.lock_client.LockedBucketSource`,
  which writes back and releases partitions between buckets); rank 0 runs the lock server
  (:mod:`bigembed.distributed.lock_planning`).
  With ``partition_prefetch`` (the default) the trainer holds the next bucket too: its
  partitions are read, and the previous bucket's written back, in background threads while the
  current bucket trains (every wait for them bounded by ``TRANSFER_DEADLINE`` x
  ``distributed_timeout``); each trainer logs its partition transfers to
  ``partition_transfers_rankR.jsonl`` beside the lock server's ``lock_events.jsonl``;
* swapped-out partitions go to the partition servers (the partition store's remote), or, with
  ``num_partition_servers: 0``, to the checkpoint directory on the shared disk, exactly as on
  one machine;
* shared parameters are kept in step by the configured communication strategy
  (:class:`~bigembed.distributed.parameter_sync.SharedParameterSync`; PBG's parameter servers
  by default);
* each step ends with a cooperative checkpoint
  (:class:`~bigembed.distributed.shared_checkpoint.CooperativeCheckpoints`): every trainer
  writes its share of partitions (``p mod M``), then rank 0 writes the unpartitioned embeddings,
  the model, the metadata and the merged stats and commits the version file last, with a
  barrier before and after, so a checkpoint is complete or absent.

Start-up order (:meth:`DistributedTrainer.train`): agree on the checkpoint and whether its
disk is shared (:func:`~bigembed.distributed.shared_checkpoint.open_checkpoint`), start the lock
server (rank 0), load the model, build the partition store, move the model to shared memory
once, seed the partition servers without a shared disk
(:mod:`~bigembed.distributed.no_shared_disk`), start parameter sharing (everyone starts from
rank 0's values), run the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch.distributed as dist

from bigembed.checkpoints import CheckpointStore
from bigembed.config import ConfigSchema
from bigembed.distributed.context import DistContext
from bigembed.distributed.lock_client import LockClient, LockedBucketSource
from bigembed.distributed.lock_planning import LockCosts, side_keys, start_lock_server
from bigembed.distributed.lock_server import EventLog, LockServer
from bigembed.distributed.no_shared_disk import (
    ServedPartitions,
    TransferRelay,
    seed_partition_servers,
)
from bigembed.distributed.parameter_sync import SharedParameterSync
from bigembed.distributed.partition_server import PartitionClient, PartitionServer
from bigembed.distributed.shared_checkpoint import CooperativeCheckpoints, open_checkpoint
from bigembed.distributed.shared_stop import SharedStop
from bigembed.storage import record_dependent
from bigembed.train import (
    ModelState,
    PartitionStore,
    TrainingJob,
    TrainingLoop,
    TrainResult,
    resume,
    standard_observers,
)

logger = logging.getLogger(__name__)

#: Each trainer's partition transfers (load_start/load_end/write_queued/write_end, with times).
TRANSFER_LOG = "partition_transfers_rank{rank}.jsonl"
#: The longest the training thread waits for one background partition transfer, in units of
#: distributed_timeout (each of a transfer's calls is bounded by it; a few may queue before it).
TRANSFER_DEADLINE = 10


class DistributedTrainer:
    """One trainer of a distributed run (see the module docstring)."""

    def __init__(
        self,
        cfg: ConfigSchema,
        ctx: DistContext,
        *,
        progress: bool = False,
        report: Callable[[str], None] | None = None,
    ) -> None:
        assert ctx.store is not None
        self.cfg = cfg
        #: rank 0's verdicts on ending the run early (set before train() when the config
        #: has early_stopping), followed by every trainer
        self.stop: SharedStop | None = None
        self.ctx = ctx
        self.rank = ctx.rank
        self.layout = ctx.layout
        self.job = TrainingJob(cfg)
        self.checkpoint = CheckpointStore(cfg.checkpoint_path)
        self.state = ModelState.build(self.job)
        self.observers = standard_observers(cfg, self.state, self.job.num_chunks, progress, report)
        self.lock_client = LockClient(
            ctx.store, ctx.rank, ctx.timeout, ctx.layout.role(0), ctx.session
        )
        self.lock_server: LockServer | None = None
        self.bucket_source: LockedBucketSource | None = None
        self.sync: SharedParameterSync | None = None
        self.partition_server: PartitionServer | None = None
        self.partition_client: PartitionClient | None = None
        self.transfer_log: EventLog | None = None
        if self.layout.num_partition_servers < 0:  # each trainer hosts one
            self.partition_server = PartitionServer(
                self.rank,
                ctx.address,
                ctx.timeout,
                on_error=ctx.fail,
                session=ctx.session,
                trainers=ctx.layout.num_trainers,
            )
            self.partition_server.start()
        if self.layout.server_ranks:
            self.partition_client = PartitionClient(
                self.rank,
                self.layout,
                ctx.store,
                ctx.timeout,
                self.partition_server,
                session=ctx.session,
                compressed=cfg.communication.partition_precision == "compressed",
                connect=self._connect,
            )

    def _connect(self) -> dist.Store:
        """A store connection of its own (for a background I/O thread)."""
        return self.ctx.address.namespaced(self.ctx.address.client(self.ctx.timeout))

    def _log_transfer(self, kind: str, key: tuple[str, int]) -> None:
        if self.transfer_log is not None:
            self.transfer_log.write(kind, trainer=self.rank, partition=[key[0], key[1]])

    def train(self) -> TrainResult:
        cfg, job, ctx = self.cfg, self.job, self.ctx
        access = open_checkpoint(ctx, self.checkpoint)
        if self.rank == 0:
            record_dependent(cfg.entity_path, self.checkpoint.path)  # `import --force` checks it
        committed = access.committed
        stopped = self.stop.at_start(committed) if self.stop is not None else None
        if stopped is not None:
            return TrainResult(version=committed, steps_run=0, stopped=stopped)
        if committed >= job.num_steps:
            logger.info(
                "training already complete (%d steps) in %s", job.num_steps, self.checkpoint.path
            )
            return TrainResult(version=committed, steps_run=0)
        costs = LockCosts(job) if self.rank == 0 else None
        if costs is not None:
            fresh = committed == 0 and not cfg.init_path
            self.lock_server = start_lock_server(ctx, job, self.checkpoint, committed, fresh, costs)
        # Without the checkpoint here, the model comes with rank 0's broadcast (parameter sync).
        init_source = resume(job, self.state, self.checkpoint, committed) if access.here else None
        shared = cfg.resolved_workers() > 1
        counts = job.partition_counts()
        overlap = bool(cfg.partition_prefetch)
        relay = None
        if access.shared:
            self.transfer_log = EventLog(self.checkpoint.path / TRANSFER_LOG.format(rank=self.rank))
        else:  # the other trainers' logs go to rank 0
            relay = TransferRelay(ctx, lambda r: self.checkpoint.path / TRANSFER_LOG.format(rank=r))
            self.transfer_log = relay.log
        pinned = job.unpartitioned(counts)
        remote: PartitionClient | ServedPartitions | None = self.partition_client
        if not access.here:  # partitions only from the servers, never from this disk
            assert self.partition_client is not None
            remote = ServedPartitions(self.partition_client, set(pinned))
        partitions = PartitionStore(
            counts,
            job.dimensions(),
            self.checkpoint,
            committed=committed,
            working=committed + 1,
            init_source=init_source,
            init_scale=cfg.init_scale,
            seed=cfg.seed,
            shared=shared,
            pinned=pinned,
            remote=remote,
            managed=True,
            background=overlap,
            deadline=TRANSFER_DEADLINE * ctx.timeout,
            on_event=self._log_transfer,
        )
        partitions.bags = job.feature_bags(shared)
        if shared:  # before the sharer holds views of them (share_memory_ moves the storage)
            self.state.move_to_shared_memory()
        # the unpartitioned and feature tables (shared) stay resident from now on
        partitions.ensure(())
        if not access.shared:
            assert self.partition_client is not None
            seed_partition_servers(ctx, partitions, self.partition_client)
        self.sync = SharedParameterSync(ctx, self.state, partitions)
        releases = self.lock_client
        if overlap:  # released from the write-back thread: its own store connection
            releases = LockClient(
                self._connect(), ctx.rank, ctx.timeout, ctx.layout.role(0), ctx.session
            )
        source = LockedBucketSource(
            self.lock_client,
            lambda b: frozenset.union(*side_keys(cfg, b)),
            partitions,
            releases=releases,
            lookahead=overlap,
        )
        self.bucket_source = source
        checkpoints = CooperativeCheckpoints(
            ctx,
            job,
            self.state,
            self.checkpoint,
            self.sync,
            self.partition_client,
            lambda: (self.net_bytes(), source.waits),
            access=access,
            relay=relay,
        )
        checkpoints.costs = costs
        loop = TrainingLoop(
            job,
            self.state,
            buckets=source,
            partitions=partitions,
            checkpoints=checkpoints,
            # the stop last: a step's summary line comes before the verdict after it
            observers=[*self.observers, self.sync, *([self.stop] if self.stop else [])],
            gate=self.sync.strategy.gate,
        )
        return loop.run(committed)

    def net_bytes(self) -> int:
        total = 0
        if self.partition_client is not None:
            total += self.partition_client.bytes_sent + self.partition_client.bytes_received
        if self.sync is not None:
            total += self.sync.strategy.wire_bytes()
        return total

    def shutdown(self) -> None:
        """Stop the services once every trainer is past its last checkpoint."""
        if self.sync is not None:
            self.sync.stop()
        self.ctx.barrier("end")
        if self.rank == 0:
            if self.lock_server is not None:
                self.lock_server.stop()
            if self.partition_client is not None:
                for server in self.layout.server_ranks:
                    if not self.layout.is_trainer(server):
                        self.partition_client.stop_server(server)
        self.ctx.barrier("services-stopped")
        if self.partition_server is not None:
            self.partition_server.stop()
        if self.transfer_log is not None:
            self.transfer_log.close()
