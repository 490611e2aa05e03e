"""The distributed trainer: the single-machine loop with distributed parts plugged in.

:class:`DistributedTrainer` subclasses :class:`~bigembed.train.loop.Trainer` and replaces only
where things come from and go to:

* buckets come from the lock server (:class:`~bigembed.distributed.lock_client.LockedBucketSource`);
* swapped-out partitions go to the partition servers (or, with ``num_partition_servers: 0``,
  to the checkpoint directory on the shared disk, exactly as on one machine);
* shared parameters are kept in step by the parameter servers and the sharer loop;
* each step ends with a cooperative checkpoint (:meth:`_save_step`, :meth:`_commit_step`):
  every trainer writes its share of partitions (``p mod M``), then rank 0 writes the
  unpartitioned embeddings, the model, the metadata and the merged stats and commits the version
  file last, with a barrier before and after, so a checkpoint is complete or absent.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.config import ConfigSchema
from bigembed.distributed.auth import BadMac, seal, unseal
from bigembed.distributed.context import DistContext
from bigembed.distributed.layout import PartitionKey
from bigembed.distributed.lock_client import LockClient, LockedBucketSource
from bigembed.distributed.lock_server import Bucket, BucketScheduler, EventLog, LockServer, PassPlan
from bigembed.distributed.param_server import ParameterServer, ShardPlan, gather
from bigembed.distributed.partition_server import PartitionClient, PartitionServer
from bigembed.distributed.sharer import Sharer
from bigembed.distributed.store import store_set
from bigembed.errors import CheckpointError, PeerError
from bigembed.storage.edges import chunk_range
from bigembed.train.loop import Iteration, Trainer, iterations
from bigembed.train.partitions import PartitionSource, PartitionStore
from bigembed.train.step import Table

logger = logging.getLogger(__name__)

EVENT_LOG = "lock_events.jsonl"
PROBE_FILE = ".bigembed_shared_disk_probe"


def _weighted(items: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Count-weighted mean of per-edge summaries (counts add up)."""
    total = sum(n for n, _ in items)
    out: dict[str, Any] = {"count": total}
    keys = {
        k for _, d in items for k, v in d.items() if isinstance(v, (int, float)) and k != "count"
    }
    for k in sorted(keys):
        out[k] = sum(n * d.get(k, 0.0) for n, d in items) / max(total, 1)
    return out


class DistributedTrainer(Trainer):
    def __init__(self, cfg: ConfigSchema, ctx: DistContext, *, progress: bool = False) -> None:
        assert ctx.store is not None
        self.ctx = ctx
        self.rank = ctx.rank
        self.layout = ctx.layout
        self.source = LockedBucketSource(
            LockClient(ctx.store, ctx.rank, ctx.timeout, ctx.layout.role(0), ctx.session),
            self._bucket_keys,
        )
        super().__init__(cfg, progress=progress, bucket_source=self.source)
        self.lock_server: LockServer | None = None
        self.partition_server: PartitionServer | None = None
        self.partition_client: PartitionClient | None = None
        self.param_server: ParameterServer | None = None
        self.sharer: Sharer | None = None
        self.pstore: PartitionStore | None = None
        self.fresh = False
        self._reported = (0, 0)  # network bytes and lock waits already in earlier steps' stats
        if self.layout.num_partition_servers < 0:
            self.partition_server = PartitionServer(
                self.rank, ctx.address, ctx.timeout, on_error=ctx.fail, session=ctx.session
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
            )

    def _signed(self, store: dist.Store, key: str) -> bytes:
        """A value another rank wrote with :func:`seal` (checked when the run has a secret)."""
        try:
            return unseal(self.ctx.session, key, store.get(key))
        except BadMac as exc:
            raise PeerError(
                f"{exc}: not signed with the run's secret; somebody else writes to "
                "the rendezvous store"
            ) from None

    # ------------------------------------------------------------------ buckets
    def _side_keys(self, bucket: Bucket) -> tuple[frozenset[PartitionKey], frozenset[PartitionKey]]:
        """The partitioned (lockable) keys of a bucket's lhs and rhs sides."""
        parted = {t for t, e in self.cfg.entities.items() if e.num_partitions > 1}
        sides = self._sides(bucket)
        lhs = frozenset(k for k, _ in sides if k[0] in parted)
        rhs = frozenset(k for _, k in sides if k[0] in parted)
        return lhs, rhs

    def _bucket_keys(self, bucket: Bucket) -> frozenset[PartitionKey]:
        lhs, rhs = self._side_keys(bucket)
        return lhs | rhs

    def _plan_for(self, index: int) -> PassPlan:
        cfg = self.cfg
        it = next(iterations(cfg.num_epochs, len(cfg.edge_paths), self.num_chunks, index))
        edges = self.edge_stores[it.edge_path_idx]
        weights = {}
        for b in edges.buckets():
            n = edges.num_edges(*b)
            if n > 0:
                start, end = chunk_range(n, it.chunk, self.num_chunks)
                weights[b] = end - start
        tree = bool(cfg.distributed_tree_init_order) and index == 0 and self.fresh
        return PassPlan(index, weights, tree)

    # ------------------------------------------------------------------ hooks of the loop
    def _open_checkpoint(self) -> int:
        ctx, ck = self.ctx, self.checkpoint
        assert ctx.store is not None
        if self.rank == 0:
            ck.path.mkdir(parents=True, exist_ok=True)
            removed = ck.discard_uncommitted()
            if removed:
                logger.info("removed %d files of an interrupted step in %s", removed, ck.path)
            nonce = secrets.token_hex(8)
            (ck.path / PROBE_FILE).write_text(nonce)
            store_set(ctx.store, "open/nonce", seal(ctx.session, "open/nonce", nonce))
            version = str(ck.committed_version())
            store_set(ctx.store, "open/version", seal(ctx.session, "open/version", version))
        ctx.barrier("open")
        committed = ck.committed_version()
        if self.rank != 0:
            nonce = self._signed(ctx.store, "open/nonce").decode()
            try:
                seen = (ck.path / PROBE_FILE).read_text()
            except OSError:
                seen = None
            if seen != nonce:
                raise CheckpointError(
                    f"checkpoint_path {ck.path} is not shared with rank 0 (this machine cannot see "
                    "the file rank 0 just wrote there): put it on a disk all machines mount"
                )
            theirs = int(self._signed(ctx.store, "open/version"))
            if theirs != committed:
                raise CheckpointError(
                    f"{ck.path}: rank 0 sees checkpoint version {theirs}, this rank {committed}"
                )
        ctx.barrier("opened")
        if self.rank == 0:
            (ck.path / PROBE_FILE).unlink(missing_ok=True)
        self.fresh = committed == 0 and not self.cfg.init_path
        if self.rank == 0:
            log = EventLog(ck.path / EVENT_LOG)
            log.write(
                "run_start",
                committed=committed,
                trainers=self.layout.num_trainers,
                partition_servers=self.cfg.num_partition_servers,
            )
            scheduler = BucketScheduler(self._side_keys, self._plan_for, log)
            self.lock_server = LockServer(
                ctx.address.namespaced(ctx.address.client(ctx.timeout)),
                scheduler,
                ctx.fail,
                session=ctx.session,
            )
            self.lock_server.start()
        return committed

    def _make_partition_store(
        self,
        counts: dict[PartitionKey, int],
        dims: dict[str, int],
        committed: int,
        init_source: PartitionSource | None,
        shared: bool,
        pinned: list[PartitionKey],
    ) -> PartitionStore:
        store = PartitionStore(
            counts,
            dims,
            self.checkpoint,
            committed=committed,
            working=committed + 1,
            init_source=init_source,
            init_scale=self.cfg.init_scale,
            seed=self.cfg.seed,
            shared=shared,
            pinned=pinned,
            remote=self.partition_client,
        )
        self.pstore = store
        self.source.store = store
        if shared:  # before the sharer holds views of them (share_memory_ moves the storage)
            self.model.share_memory()
            for s in self.model_states:
                s.share_memory_()
        store.ensure(())  # the unpartitioned (shared) tables stay resident from now on
        self._start_sharing(store)
        return store

    def _shared_tensors(self, store: PartitionStore) -> tuple[list[str], list[Tensor]]:
        names, tensors = [], []
        named = self.model.named_parameters()
        for (name, param), state in zip(named, self.model_states, strict=True):
            names += [f"param/{name}", f"adagrad/{name}"]
            tensors += [param, state]
        for key in sorted(store.pinned):
            table = store.get(key)
            names += [f"emb/{key[0]}", f"emb_state/{key[0]}"]
            tensors += [table.emb, table.state]
        return names, tensors

    def _start_sharing(self, store: PartitionStore) -> None:
        ctx = self.ctx
        names, tensors = self._shared_tensors(store)
        with torch.no_grad():  # every trainer starts from rank 0's values
            for t in tensors:
                dist.broadcast(t.data, src=0, group=ctx.trainer_group)
        plan = ShardPlan(names, [t.numel() for t in tensors], self.layout.trainers)
        flat = [t.data.view(-1) for t in tensors]
        self.param_server = ParameterServer(
            self.rank,
            gather(flat, plan.segments[self.rank]),
            self.layout.trainers,
            ctx.trainer_group,
            ctx.fail,
        )
        self.param_server.start()
        self.sharer = Sharer(
            self.rank, plan, tensors, self.param_server, ctx.trainer_group, ctx.fail
        )
        self.sharer.start()

    def _sync_shared(self) -> None:
        if self.sharer is not None:
            try:
                self.sharer.flush(self.ctx.timeout * 2)
            except TimeoutError as exc:
                raise PeerError(str(exc)) from None

    def _save_step(self, it: Iteration, store: PartitionStore) -> None:
        version = it.index + 1
        # The lock server said "done": this trainer has handed back all its partitions.
        self._sync_shared()  # push this trainer's last updates
        self.ctx.barrier(f"v{version}/trained")
        self._sync_shared()  # pull everybody's
        self._write_partitions(store, version)

    def _write_partitions(self, store: PartitionStore, version: int) -> None:
        """Write this trainer's share (``p mod M``) of the partitioned tables."""
        ck = self.checkpoint
        for key in sorted(store.counts):
            if key in store.pinned or self.layout.writer_for(key) != self.rank:
                continue
            etype, part = key
            if self.partition_client is not None:
                table = Table(
                    torch.empty((store.counts[key], store.dims[etype])),
                    torch.empty(store.counts[key]),
                )
                if self.partition_client.fetch(key, table.emb, table.state):
                    ck.save_partition(etype, part, version, table.emb, table.state)
                    continue
            if ck.has_partition(etype, part, version):
                continue  # swapped out through the checkpoint directory during this step
            if store.committed > 0 and ck.has_partition(etype, part, store.committed):
                ck.link_partition(etype, part, store.committed, version)
                continue
            table = store.read(key)  # never touched yet: materialise its initial value
            ck.save_partition(etype, part, version, table.emb, table.state)

    def net_bytes(self) -> int:
        total = 0
        if self.partition_client is not None:
            total += self.partition_client.bytes_sent + self.partition_client.bytes_received
        if self.sharer is not None:
            total += self.sharer.bytes_sent + self.sharer.bytes_received
        return total

    def _commit_step(
        self, it: Iteration, records: list[dict[str, Any]], summary: dict[str, Any]
    ) -> None:
        ctx, ck = self.ctx, self.checkpoint
        assert ctx.store is not None and self.pstore is not None
        version = it.index + 1
        net, waits = self.net_bytes(), self.source.waits
        summary = {
            **summary,
            "net_bytes": net - self._reported[0],
            "lock_waits": waits - self._reported[1],
        }
        self._reported = (net, waits)
        key = f"stats/{version}/{self.rank}"
        store_set(
            ctx.store,
            key,
            seal(ctx.session, key, json.dumps({"records": records, "summary": summary})),
        )
        ctx.barrier(f"v{version}/written")
        if self.rank == 0:
            parts = []
            for r in self.layout.trainers:
                parts.append(json.loads(self._signed(ctx.store, f"stats/{version}/{r}")))
                ctx.store.delete_key(f"stats/{version}/{r}")
            all_records = [
                {**rec, "trainer": r} for r, p in enumerate(parts) for rec in p["records"]
            ]
            merged = self._merge_summaries([p["summary"] for p in parts])
            for pkey in sorted(self.pstore.pinned):
                table = self.pstore.get(pkey)
                ck.save_partition(pkey[0], pkey[1], version, table.emb, table.state)
            ck.save_model(version, self._model_payload())
            ck.save_metadata(version, self._metadata(it))
            super()._commit_step(it, all_records, merged)
            logger.info(
                "step %d committed: %d edges by %d trainers, loss %.4f, %.0f edges/s, "
                "%.1f MB over the network",
                version,
                merged["stats"]["count"],
                self.layout.num_trainers,
                merged["stats"]["loss"],
                merged["edges_per_sec"],
                merged["net_bytes"] / 1e6,
            )
        ctx.barrier(f"v{version}/committed")

    def _merge_summaries(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        first = parts[0]
        seconds = max(p["seconds"] for p in parts)
        stats = _weighted([(p["stats"]["count"], p["stats"]) for p in parts])
        out: dict[str, Any] = {
            k: first[k] for k in ("type", "version", "epoch_idx", "edge_path_idx", "edge_chunk_idx")
        }
        out.update(
            {
                "stats": stats,
                "seconds": seconds,
                "edges_per_sec": stats["count"] / seconds if seconds > 0 else 0.0,
                "io_bytes_read": sum(p["io_bytes_read"] for p in parts),
                "io_bytes_written": sum(p["io_bytes_written"] for p in parts),
                "net_bytes": sum(p["net_bytes"] for p in parts),
                "lock_waits": sum(p["lock_waits"] for p in parts),
                "trainers": len(parts),
            }
        )
        for key in ("eval_stats_before", "eval_stats_after"):
            evals = [(p[key]["count"], p[key]) for p in parts if key in p]
            if evals:
                out[key] = _weighted(evals)
        return out

    # ------------------------------------------------------------------ the end
    def shutdown(self) -> None:
        """Stop the services once every trainer is past its last checkpoint."""
        if self.sharer is not None:
            self.sharer.stop()
        if self.param_server is not None:
            self.param_server.join(timeout=self.ctx.timeout)
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
