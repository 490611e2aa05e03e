"""The checkpoint of a distributed run: one directory, on a disk every machine shares or not.

:func:`open_checkpoint` makes every rank agree on it at start-up (rank 0 discards an
interrupted step and writes a probe file; a rank that does not see it runs without a shared
disk, :mod:`bigembed.distributed.no_shared_disk`). :class:`CooperativeCheckpoints` is the
distributed checkpoint policy: each step ends with every trainer writing its share of
partitions (``p mod M``; without a shared disk rank 0 writes all of them, pulled from the
partition servers), then rank 0 writing the unpartitioned embeddings, the model, the metadata
and the merged stats and committing the version file last, with a barrier before and after, so
a checkpoint is complete or absent.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bigembed.checkpoints import CheckpointStore
from bigembed.distributed.auth import BadMac, Session, seal, unseal
from bigembed.distributed.context import DistContext
from bigembed.distributed.lock_planning import LockCosts
from bigembed.distributed.no_shared_disk import TransferRelay, pull_partitions
from bigembed.distributed.parameter_sync import SharedParameterSync
from bigembed.distributed.partition_server import PartitionClient
from bigembed.distributed.store import store_set
from bigembed.errors import CheckpointError, PeerError
from bigembed.kernels import Table
from bigembed.train import (
    Iteration,
    ModelState,
    PartitionStore,
    StepLog,
    StepRecord,
    TrainingJob,
    checkpoint_metadata,
    commit_with_stats,
    merge_step_logs,
)

logger = logging.getLogger(__name__)

PROBE_FILE = ".bigembed_shared_disk_probe"


def signed_value(ctx: DistContext, key: str) -> bytes:
    """A value another rank wrote with :func:`seal` (checked when the run has a secret)."""
    assert ctx.store is not None
    try:
        return unseal(ctx.session, key, ctx.store.get(key))
    except BadMac as exc:
        raise PeerError(
            f"{exc}: not signed with the run's secret; somebody else writes to the rendezvous store"
        ) from None


def publish_signed(store: dist.Store, session: Session | None, key: str, value: str) -> None:
    """Write ``value`` for the other ranks, signed with the run's key when it has a secret."""
    store_set(store, key, seal(session, key, value))


@dataclass(frozen=True)
class CheckpointAccess:
    """How the run reaches its checkpoint, as :func:`open_checkpoint` found out."""

    committed: int  # the committed version (rank 0's)
    shared: bool  # every trainer sees rank 0's checkpoint directory
    rank: int

    @property
    def here(self) -> bool:
        """This rank reads and writes the checkpoint directory: every rank on a shared disk,
        only rank 0 without one (:mod:`bigembed.distributed.no_shared_disk`)."""
        return self.shared or self.rank == 0


def publish_step_log(ctx: DistContext, version: int, log: StepLog) -> None:
    """This trainer's log of step ``version``, for rank 0 (:func:`collect_step_logs`)."""
    assert ctx.store is not None
    key = f"stats/{version}/{ctx.rank}"
    publish_signed(ctx.store, ctx.session, key, json.dumps(log.to_json()))


def collect_step_logs(ctx: DistContext, version: int) -> StepLog:
    """Rank 0, after a barrier that follows every trainer's :func:`publish_step_log`: their
    logs of step ``version``, merged (and removed from the store)."""
    assert ctx.store is not None
    parts = []
    for r in ctx.layout.trainers:
        parts.append(StepLog.from_json(json.loads(signed_value(ctx, f"stats/{version}/{r}"))))
        ctx.store.delete_key(f"stats/{version}/{r}")
    return merge_step_logs(parts)


def share_merged_step(ctx: DistContext, version: int, step: StepRecord | None) -> StepRecord:
    """Every trainer's copy of step ``version``'s merged record, so that every rank's summary
    and result show the run's figures, not its own share (a trainer that got no bucket would
    report zeros). Rank 0 passes the record it merged and publishes it before the step's
    ``committed`` barrier; the others pass None and read it after that barrier. Rank 0 removes
    the previous step's record, which every trainer has read by then (they passed this step's
    ``written`` barrier after reading it)."""
    assert ctx.store is not None
    key = f"stats/{version}/merged"
    if ctx.rank == 0:
        assert step is not None
        publish_signed(ctx.store, ctx.session, key, json.dumps(step.to_json()))
        if version > 1:
            ctx.store.delete_key(f"stats/{version - 1}/merged")
        return step
    return StepRecord.from_json(json.loads(signed_value(ctx, key)))


def open_shared_checkpoint(ctx: DistContext, checkpoint: CheckpointStore) -> int:
    """:func:`open_checkpoint` for a caller that needs a shared disk (refused without one);
    returns the committed version."""
    return open_checkpoint(ctx, checkpoint, private_ok=False).committed


def open_checkpoint(
    ctx: DistContext, checkpoint: CheckpointStore, *, private_ok: bool = True
) -> CheckpointAccess:
    """Open the checkpoint on every rank and find out whether the disk is shared.

    Rank 0 discards an interrupted step's files and writes a probe file; a rank that sees it
    (the directory is on a disk it shares with rank 0) must see the same version. A rank that
    does not see it says so in one line: the run then goes without a shared disk (every rank
    learns this), which needs partition servers and ``private_ok``; such a rank never reads
    its own ``checkpoint_path`` and takes rank 0's version.
    """
    assert ctx.store is not None
    ck = checkpoint
    if ctx.rank == 0:
        ck.open_for_training()
        nonce = secrets.token_hex(8)
        (ck.path / PROBE_FILE).write_text(nonce)
        publish_signed(ctx.store, ctx.session, "open/nonce", nonce)
        publish_signed(ctx.store, ctx.session, "open/version", str(ck.committed_version()))
    ctx.barrier("open")
    committed = int(signed_value(ctx, "open/version"))
    if ctx.rank != 0:
        nonce = signed_value(ctx, "open/nonce").decode()
        try:
            seen = (ck.path / PROBE_FILE).read_text()
        except OSError:
            seen = None
        if seen != nonce:
            _check_private_ok(ctx, ck, private_ok)
            logger.info(
                "checkpoint_path %s is not shared with rank 0: running without a shared disk "
                "(rank 0 writes the checkpoint; this rank writes nothing there)",
                ck.path,
            )
        elif ck.committed_version() != committed:
            raise CheckpointError(
                f"{ck.path}: rank 0 sees checkpoint version {committed}, "
                f"this rank {ck.committed_version()}"
            )
        publish_signed(ctx.store, ctx.session, f"open/sees/{ctx.rank}", str(int(seen == nonce)))
    ctx.barrier("opened")
    shared = all(signed_value(ctx, f"open/sees/{r}") == b"1" for r in ctx.layout.trainers[1:])
    if ctx.rank == 0:
        (ck.path / PROBE_FILE).unlink(missing_ok=True)
        if not shared:
            logger.info("no shared disk: rank 0 writes the checkpoint, pulling partitions")
    return CheckpointAccess(committed, shared, ctx.rank)


def _check_private_ok(ctx: DistContext, ck: CheckpointStore, private_ok: bool) -> None:
    """Refuse a run without a shared disk where it cannot work."""
    unshared = f"checkpoint_path {ck.path} is not shared with rank 0 (this machine cannot see "
    if ctx.layout.num_partition_servers == 0:
        raise CheckpointError(
            unshared + "the file rank 0 just wrote there) and num_partition_servers is 0 "
            "(partitions swap through the checkpoint directory): put it on a disk all machines "
            "mount, or set num_partition_servers: -1 (or N > 0) to run without a shared disk"
        )
    if not private_ok:
        raise CheckpointError(
            unshared + "the file rank 0 just wrote there): put it on a disk all machines mount"
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
        *,
        access: CheckpointAccess | None = None,
        relay: TransferRelay | None = None,
    ) -> None:
        """``access``: from :func:`open_checkpoint` (None: a shared disk); ``relay``: the
        other trainers' transfer logs, sent to rank 0 (without a shared disk)."""
        self.ctx = ctx
        self.shared = access is None or access.shared
        self.relay = relay
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
        if self.shared:
            self._write_partition_share(partitions, it.version)
        elif self.ctx.rank == 0:  # no shared disk: rank 0 writes them all, pulled from servers
            assert self.partition_client is not None
            pull_partitions(self.checkpoint, partitions, self.partition_client, it.version)

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

    def commit_step(self, it: Iteration, log: StepLog) -> StepRecord:
        ctx, ck = self.ctx, self.checkpoint
        assert ctx.store is not None and self.partitions is not None
        version = it.version
        net, waits = self.counters()
        log.step.net_bytes = net - self._reported[0]
        log.step.lock_waits = waits - self._reported[1]
        self._reported = (net, waits)
        publish_step_log(ctx, version, log)
        if self.relay is not None:
            self.relay.publish(version)
        ctx.barrier(f"v{version}/written")
        merged_step: StepRecord | None = None
        if ctx.rank == 0:
            if self.relay is not None:
                self.relay.collect(version)
            merged = collect_step_logs(ctx, version)
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
            merged_step = share_merged_step(ctx, version, step)
        ctx.barrier(f"v{version}/committed")
        return merged_step or share_merged_step(ctx, version, None)
