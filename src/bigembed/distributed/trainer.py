"""The distributed trainer: the single-machine loop composed with distributed parts.

:class:`DistributedTrainer` builds the same :class:`~bigembed.train.loop.TrainingLoop` as one
machine does, from different parts:

* buckets come from the lock server (:class:`~bigembed.distributed.lock_client.LockedBucketSource`,
  which writes back and releases partitions between buckets); rank 0 runs the lock server.
  With ``partition_prefetch`` (the default) the trainer holds the next bucket too: its
  partitions are read, and the previous bucket's written back, in background threads while the
  current bucket trains (every wait for them bounded by ``TRANSFER_DEADLINE`` x
  ``distributed_timeout``); each trainer logs its partition transfers to
  ``partition_transfers_rankR.jsonl`` beside the lock server's ``lock_events.jsonl``;
* swapped-out partitions go to the partition servers (the partition store's remote), or, with
  ``num_partition_servers: 0``, to the checkpoint directory on the shared disk, exactly as on
  one machine;
* shared parameters are kept in step by the configured communication strategy
  (:class:`SharedParameterSync`; PBG's parameter servers by default);
* each step ends with a cooperative checkpoint (:class:`CooperativeCheckpoints`): every trainer
  writes its share of partitions (``p mod M``), then rank 0 writes the unpartitioned embeddings,
  the model, the metadata and the merged stats and commits the version file last, with a
  barrier before and after, so a checkpoint is complete or absent.

Start-up order (:meth:`DistributedTrainer.train`): agree on the shared checkpoint
(:func:`open_shared_checkpoint`), start the lock server (rank 0), load the model, build the
partition store, move the model to shared memory once, start parameter sharing (everyone starts
from rank 0's values), run the loop.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.buckets import bucket_sides, chunk_sizes
from bigembed.checkpoints import CheckpointStore
from bigembed.communication import SharedTensors, StrategyEnv, get_codec, make_strategy
from bigembed.config import ConfigSchema
from bigembed.distributed.auth import BadMac, Session, seal, unseal
from bigembed.distributed.context import DistContext
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.lock_client import LockClient, LockedBucketSource
from bigembed.distributed.lock_server import (
    BucketScheduler,
    EventLog,
    LockServer,
    PassPlan,
    SideKeys,
)
from bigembed.distributed.partition_server import PartitionClient, PartitionServer
from bigembed.distributed.store import store_set
from bigembed.errors import CheckpointError, PeerError
from bigembed.kernels import Table
from bigembed.partition_keys import Bucket
from bigembed.train import (
    BucketRecord,
    BucketSample,
    BucketWork,
    CostModel,
    Iteration,
    ModelState,
    Observer,
    PartitionStore,
    StepLog,
    TrainingJob,
    TrainingLoop,
    TrainResult,
    bucket_costs,
    checkpoint_metadata,
    commit_with_stats,
    fit_from_buckets,
    iterations,
    merge_step_logs,
    resume,
    standard_observers,
)

logger = logging.getLogger(__name__)

EVENT_LOG = "lock_events.jsonl"
#: Each trainer's partition transfers (load_start/load_end/write_queued/write_end, with times).
TRANSFER_LOG = "partition_transfers_rank{rank}.jsonl"
#: The longest the training thread waits for one background partition transfer, in units of
#: distributed_timeout (each of a transfer's calls is bounded by it; a few may queue before it).
TRANSFER_DEADLINE = 10
PROBE_FILE = ".bigembed_shared_disk_probe"


def _signed(ctx: DistContext, key: str) -> bytes:
    """A value another rank wrote with :func:`seal` (checked when the run has a secret)."""
    assert ctx.store is not None
    try:
        return unseal(ctx.session, key, ctx.store.get(key))
    except BadMac as exc:
        raise PeerError(
            f"{exc}: not signed with the run's secret; somebody else writes to the rendezvous store"
        ) from None


def _publish(store: dist.Store, session: Session | None, key: str, value: str) -> None:
    store_set(store, key, seal(session, key, value))


def open_shared_checkpoint(ctx: DistContext, checkpoint: CheckpointStore) -> int:
    """Open the checkpoint on every rank; returns the committed version they all see.

    Rank 0 discards an interrupted step's files and writes a probe file; every other rank must
    see the probe (the directory is on a disk all machines share) and the same version.
    """
    assert ctx.store is not None
    ck = checkpoint
    if ctx.rank == 0:
        ck.open_for_training()
        nonce = secrets.token_hex(8)
        (ck.path / PROBE_FILE).write_text(nonce)
        _publish(ctx.store, ctx.session, "open/nonce", nonce)
        _publish(ctx.store, ctx.session, "open/version", str(ck.committed_version()))
    ctx.barrier("open")
    committed = ck.committed_version()
    if ctx.rank != 0:
        nonce = _signed(ctx, "open/nonce").decode()
        try:
            seen = (ck.path / PROBE_FILE).read_text()
        except OSError:
            seen = None
        if seen != nonce:
            raise CheckpointError(
                f"checkpoint_path {ck.path} is not shared with rank 0 (this machine cannot see "
                "the file rank 0 just wrote there): put it on a disk all machines mount"
            )
        theirs = int(_signed(ctx, "open/version"))
        if theirs != committed:
            raise CheckpointError(
                f"{ck.path}: rank 0 sees checkpoint version {theirs}, this rank {committed}"
            )
    ctx.barrier("opened")
    if ctx.rank == 0:
        (ck.path / PROBE_FILE).unlink(missing_ok=True)
    return committed


def side_keys(cfg: ConfigSchema, bucket: Bucket) -> SideKeys:
    """The partitioned (lockable) keys of a bucket's lhs and rhs sides."""
    parted = {t for t, e in cfg.entities.items() if e.num_partitions > 1}
    sides = bucket_sides(cfg, bucket)
    lhs = frozenset(k for k, _ in sides if k[0] in parted)
    rhs = frozenset(k for _, k in sides if k[0] in parted)
    return lhs, rhs


def lock_cost_model(job: TrainingJob) -> CostModel | None:
    """The analytic cost model the ``cost`` grant policy starts from (None with
    ``load_balancing: pbg``, which weighs buckets by edge count); :class:`LockCosts` replaces it
    with seconds per edge fitted to the first step's buckets."""
    cfg = job.cfg
    if cfg.load_balancing != "cost":
        return None
    counts = job.partition_counts()
    rows = max(counts.values(), default=1) if counts else 1
    model = CostModel.analytic(cfg, all_negs_rows=rows)
    logger.info("cost model (multiply-adds per edge): %s", model.per_edge)
    return model


class LockCosts:
    """Rank 0: the lock server's cost model, calibrated once from the step statistics.

    After the first step this run trains, the busy seconds of every bucket (all trainers'
    records, merged on rank 0) and its edges per relation signature give seconds per edge per
    signature (:func:`~bigembed.train.memory.cost_calibration.fit_from_buckets`); the passes planned
    after that use them. No extra timing run: calibrating at start-up with one made the
    allreduce strategy's first gloo round time out (a long silent pause on rank 0 only)."""

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.model = lock_cost_model(job)
        self.calibrated = self.model is None

    def observe(self, records: list[BucketRecord]) -> None:
        """The merged bucket records of a committed step (only the first one is used)."""
        if self.calibrated or self.model is None:
            return
        self.calibrated = True
        cfg, model = self.job.cfg, self.model
        samples = []
        for r in records:
            if r.timing is None or r.stats.count == 0:
                continue
            key = r.at.edge_path_idx
            bucket = (r.lhs_partition, r.rhs_partition)
            shares = model.signature_shares(cfg, self.job.edge_stores[key], bucket, key)
            seconds = sum(r.timing.worker_seconds) or r.timing.train_seconds
            samples.append(BucketSample({g: f * r.stats.count for g, f in shares.items()}, seconds))
        fitted = fit_from_buckets(model, samples)
        if fitted is not None:
            self.model = fitted
            logger.info(
                "cost model calibrated from %d buckets (s/edge): %s", len(samples), fitted.per_edge
            )


def start_lock_server(
    ctx: DistContext,
    job: TrainingJob,
    checkpoint: CheckpointStore,
    committed: int,
    fresh: bool,
    costs: LockCosts,
) -> LockServer:
    """Rank 0: start the lock server of a run resumed at ``committed`` (logs to EVENT_LOG)."""
    cfg = job.cfg

    def plan_for(index: int) -> PassPlan:
        it = next(iterations(cfg.num_epochs, len(cfg.edge_paths), job.num_chunks, index))
        store = job.edge_stores[it.edge_path_idx]
        weights = chunk_sizes(store, it.chunk, job.num_chunks)
        tree = bool(cfg.distributed_tree_init_order) and index == 0 and fresh
        model = costs.model
        if model is None:
            return PassPlan(index, weights, tree)
        per_bucket = bucket_costs(cfg, store, it.chunk, job.num_chunks, model, it.edge_path_idx)
        return PassPlan(index, weights, tree, per_bucket)

    log = EventLog(checkpoint.path / EVENT_LOG)
    log.write(
        "run_start",
        committed=committed,
        trainers=RankLayout.of(cfg).num_trainers,
        partition_servers=cfg.num_partition_servers,
    )
    server = LockServer(
        ctx.address.namespaced(ctx.address.client(ctx.timeout)),
        BucketScheduler(
            lambda b: side_keys(cfg, b),
            plan_for,
            log,
            policy=cfg.load_balancing,
            trainers=ctx.layout.num_trainers,
        ),
        ctx.fail,
        session=ctx.session,
        trainers=ctx.layout.num_trainers,
    )
    server.start()
    return server


#: Names (see SharedParameterSync._shared_tensors) of the Adagrad accumulators: kept >= 0.
ACCUMULATOR_PREFIXES = ("adagrad/", "emb_state/")


class SharedParameterSync(Observer):
    """The shared parameters (model, Adagrad state, unpartitioned embeddings) kept in step
    across trainers by the configured communication strategy
    (:mod:`bigembed.communication.strategies`). It watches the loop as an observer only to
    tell the strategy when buckets start and end (a synchronous strategy rounds up a bucket's
    last batches when it ends); the strategy's gate, not the observer, holds workers back."""

    def __init__(self, ctx: DistContext, state: ModelState, partitions: PartitionStore) -> None:
        """Broadcast rank 0's values to every trainer, then start the strategy.

        The tensors must already be where they stay (shared memory, resident tables): the
        strategy holds views of them."""
        self.ctx = ctx
        cfg = ctx.cfg
        names, tensors = self._shared_tensors(state, partitions)
        with torch.no_grad():  # every trainer starts from rank 0's values
            for t in tensors:
                dist.broadcast(t.data, src=0, group=ctx.trainer_group)
        accumulators = frozenset(
            i for i, n in enumerate(names) if n.startswith(ACCUMULATOR_PREFIXES)
        )
        comm = cfg.communication
        env = StrategyEnv(
            rank=ctx.rank,
            trainers=ctx.layout.trainers,
            group=ctx.trainer_group,
            codec=get_codec(comm.precision),
            workers=cfg.resolved_workers(),
            sync_every=comm.sync_every,
            sync_interval=comm.sync_interval,
            on_error=ctx.fail,
        )
        self.strategy = make_strategy(
            comm.strategy, env, SharedTensors(names, tensors, accumulators)
        )
        self.strategy.start()

    @staticmethod
    def _shared_tensors(
        state: ModelState, partitions: PartitionStore
    ) -> tuple[list[str], list[Tensor]]:
        names, tensors = [], []
        named = state.model.named_parameters()
        for (name, param), adagrad in zip(named, state.adagrad, strict=True):
            names += [f"param/{name}", f"adagrad/{name}"]
            tensors += [param, adagrad]
        for key in sorted(partitions.pinned):
            table = partitions.get(key)
            names += [f"emb/{key[0]}", f"emb_state/{key[0]}"]
            tensors += [table.emb, table.state]
        return names, tensors

    # the strategy's bucket hooks
    def bucket_started(self, work: BucketWork) -> None:
        self.strategy.bucket_started()

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        self.strategy.bucket_finished()

    def flush(self) -> None:
        """Send this trainer's pending changes to the others."""
        self._call(self.strategy.flush)

    def agree(self) -> None:
        """After every trainer flushed: hold the values the checkpoint commits."""
        self._call(self.strategy.agree)

    def _call(self, hook: Callable[[float], None]) -> None:
        try:
            hook(self.ctx.timeout * 2)
        except TimeoutError as exc:
            raise PeerError(str(exc)) from None

    def stop(self) -> None:
        strategy = self.strategy
        strategy.stop()
        logger.info(
            "shared parameters (%s, %s): %d rounds, %d bytes sent, %d bytes received",
            strategy.name,
            strategy.env.codec.name,
            strategy.rounds,
            strategy.bytes_sent,
            strategy.bytes_received,
        )


class CooperativeCheckpoints:
    """The distributed checkpoint policy: every trainer writes its share, rank 0 commits."""

    def __init__(
        self,
        ctx: DistContext,
        job: TrainingJob,
        state: ModelState,
        checkpoint: CheckpointStore,
        sync: SharedParameterSync,
        partition_client: PartitionClient | None,
        counters: Callable[[], tuple[int, int]],
    ) -> None:
        self.ctx = ctx
        self.job = job
        self.state = state
        self.checkpoint = checkpoint
        self.sync = sync
        self.partition_client = partition_client
        self.counters = counters  # (network bytes, lock waits) so far in this run
        self.costs: LockCosts | None = None  # rank 0: fed each step's merged bucket records
        self._reported = (0, 0)  # ... of them already in earlier steps' stats
        self.partitions: PartitionStore | None = None

    def save_step(self, it: Iteration, partitions: PartitionStore) -> None:
        # The lock server said "done": this trainer has handed back all its partitions.
        self.partitions = partitions
        self.sync.flush()  # push this trainer's last updates
        self.ctx.barrier(f"v{it.version}/trained")
        self.sync.agree()  # everybody's, agreed: what the checkpoint commits
        self._write_partition_share(partitions, it.version)

    def _write_partition_share(self, store: PartitionStore, version: int) -> None:
        """Write this trainer's share (``p mod M``) of the partitioned tables."""
        ck, layout = self.checkpoint, self.ctx.layout
        for key in sorted(store.counts):
            if key in store.pinned or layout.writer_for(key) != self.ctx.rank:
                continue
            etype, part = key
            if self.partition_client is not None:
                table = Table(
                    torch.empty((store.counts[key], store.dims[etype])),
                    torch.empty(store.counts[key]),
                )
                if self.partition_client.fetch(key, table.emb, table.state, exact=True):
                    ck.save_partition(etype, part, version, table.emb, table.state)
                    continue
            if ck.has_partition(etype, part, version):
                continue  # swapped out through the checkpoint directory during this step
            if store.committed > 0 and ck.has_partition(etype, part, store.committed):
                ck.link_partition(etype, part, store.committed, version)
                continue
            table = store.read(key)  # never touched yet: materialise its initial value
            ck.save_partition(etype, part, version, table.emb, table.state)

    def commit_step(self, it: Iteration, log: StepLog) -> None:
        ctx, ck = self.ctx, self.checkpoint
        assert ctx.store is not None and self.partitions is not None
        version = it.version
        net, waits = self.counters()
        log.step.net_bytes = net - self._reported[0]
        log.step.lock_waits = waits - self._reported[1]
        self._reported = (net, waits)
        key = f"stats/{version}/{ctx.rank}"
        _publish(ctx.store, ctx.session, key, json.dumps(log.to_json()))
        ctx.barrier(f"v{version}/written")
        if ctx.rank == 0:
            parts = []
            for r in ctx.layout.trainers:
                parts.append(StepLog.from_json(json.loads(_signed(ctx, f"stats/{version}/{r}"))))
                ctx.store.delete_key(f"stats/{version}/{r}")
            merged = merge_step_logs(parts)
            if self.costs is not None:
                self.costs.observe(merged.buckets)
            for pkey in sorted(self.partitions.pinned):
                table = self.partitions.get(pkey)
                ck.save_partition(pkey[0], pkey[1], version, table.emb, table.state)
            ck.save_model(version, self.state.payload())
            ck.write_metadata(checkpoint_metadata(self.job, it))
            commit_with_stats(self.job, ck, it, merged)
            step = merged.step
            logger.info(
                "step %d committed: %d edges by %d trainers, loss %.4f, %.0f edges/s, "
                "%.1f MB over the network",
                version,
                step.stats.count,
                ctx.layout.num_trainers,
                step.stats.loss,
                step.edges_per_sec,
                (step.net_bytes or 0) / 1e6,
            )
        ctx.barrier(f"v{version}/committed")


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
        committed = open_shared_checkpoint(ctx, self.checkpoint)
        if committed >= job.num_steps:
            logger.info(
                "training already complete (%d steps) in %s", job.num_steps, self.checkpoint.path
            )
            return TrainResult(version=committed, steps_run=0)
        costs = LockCosts(job) if self.rank == 0 else None
        if costs is not None:
            fresh = committed == 0 and not cfg.init_path
            self.lock_server = start_lock_server(ctx, job, self.checkpoint, committed, fresh, costs)
        init_source = resume(job, self.state, self.checkpoint, committed)
        shared = cfg.resolved_workers() > 1
        counts = job.partition_counts()
        overlap = bool(cfg.partition_prefetch)
        self.transfer_log = EventLog(self.checkpoint.path / TRANSFER_LOG.format(rank=self.rank))
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
            pinned=job.unpartitioned(counts),
            remote=self.partition_client,
            managed=True,
            background=overlap,
            deadline=TRANSFER_DEADLINE * ctx.timeout,
            on_event=self._log_transfer,
        )
        if shared:  # before the sharer holds views of them (share_memory_ moves the storage)
            self.state.move_to_shared_memory()
        partitions.ensure(())  # the unpartitioned (shared) tables stay resident from now on
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
        )
        checkpoints.costs = costs
        loop = TrainingLoop(
            job,
            self.state,
            buckets=source,
            partitions=partitions,
            checkpoints=checkpoints,
            observers=[*self.observers, self.sync],
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
