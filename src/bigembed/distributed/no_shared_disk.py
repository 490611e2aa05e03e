"""A distributed run without a disk every machine shares: the checkpoint lives on rank 0 only.

When some trainer cannot see rank 0's checkpoint directory
(:func:`~bigembed.distributed.shared_checkpoint.open_checkpoint` finds out), the run keeps one
invariant instead of a shared disk: **the partition servers hold every partitioned table, from
start to end.** Then:

* at start rank 0 seeds them (:func:`seed_partition_servers`): it reads every partition from
  its checkpoint (the committed version, the warm start, or the initial values from the seed)
  and hands it to its server, so no trainer ever reads a partition from disk;
* the other trainers read partitions only from the servers (:class:`ServedPartitions`; a
  partition a server lacks is an error, never a silent re-initialisation) and take the model
  and the unpartitioned tables from rank 0's broadcast, which parameter sharing does anyway;
* each checkpoint is written by rank 0 alone (:func:`pull_partitions`: every partition
  fetched from its server in fp32, its own server's by a copy in memory);
* the other trainers' partition-transfer logs travel to rank 0 with each step's stats
  (:class:`TransferRelay`), which appends them to ``partition_transfers_rankR.jsonl`` in its
  checkpoint directory.

So a trainer other than rank 0 writes nothing into its ``checkpoint_path``, and reads nothing
there either. Swapping partitions through the checkpoint directory
(``num_partition_servers: 0``) needs a shared disk and is refused without one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bigembed.checkpoints import CheckpointStore
from bigembed.distributed.auth import BadMac, seal, unseal
from bigembed.distributed.context import DistContext
from bigembed.distributed.lock_server import EventLog
from bigembed.distributed.partition_server import PartitionClient
from bigembed.distributed.store import store_set
from bigembed.errors import PeerError
from bigembed.kernels import Table
from bigembed.partition_keys import PartitionKey
from bigembed.train import PartitionStore

logger = logging.getLogger(__name__)


def _name(key: PartitionKey) -> str:
    return f"partition {key[1]} of '{key[0]}'"


class ServedPartitions:
    """The partition remote of a trainer that has no checkpoint directory (rank != 0 without a
    shared disk): partitioned tables come only from the servers (rank 0 seeded them); an
    unpartitioned table is zeroed here, its value arriving with rank 0's broadcast. So the
    partition store never falls back to the disk."""

    def __init__(self, client: PartitionClient, pinned: set[PartitionKey]) -> None:
        self.client = client
        self.pinned = pinned

    def fetch(self, key: PartitionKey, out_emb: torch.Tensor, out_state: torch.Tensor) -> bool:
        if key in self.pinned:
            out_emb.zero_()
            out_state.zero_()
            return True
        if self.client.fetch(key, out_emb, out_state):
            return True
        server = self.client.layout.role(self.client.layout.server_for(key))
        raise PeerError(
            f"{server} does not hold {_name(key)}: without a shared disk the partition servers "
            "must hold every partition (rank 0 seeds them at start); was that server restarted "
            "alone?"
        )

    def store(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None:
        self.client.store(key, emb, state)


def seed_partition_servers(
    ctx: DistContext, partitions: PartitionStore, client: PartitionClient
) -> None:
    """Rank 0 hands every partitioned table (as its checkpoint, warm start or seed gives it) to
    its partition server, one at a time; the other trainers wait at a barrier until it is done,
    so no trainer asks a server for a partition it has not been given yet."""
    if ctx.rank == 0:
        started = time.perf_counter()
        sent = 0
        for key in sorted(partitions.counts):
            if key in partitions.pinned:
                continue
            table = partitions.read(key)
            client.store(key, table.emb, table.state)
            sent += partitions.table_bytes(key)
            del table
        logger.info(
            "no shared disk: seeded the partition servers with %.1f MB in %.1fs",
            sent / 1e6,
            time.perf_counter() - started,
        )
    ctx.barrier("seeded")


def pull_partitions(
    checkpoint: CheckpointStore,
    partitions: PartitionStore,
    client: PartitionClient,
    version: int,
) -> None:
    """Rank 0 writes every partitioned table of ``version``, fetched from its server in fp32
    (the servers hold all of them: see the module docstring)."""
    for key in sorted(partitions.counts):
        if key in partitions.pinned:
            continue
        rows, dim = partitions.counts[key], partitions.dims[key[0]]
        table = Table(torch.empty((rows, dim)), torch.empty(rows))
        if not client.fetch(key, table.emb, table.state, exact=True):
            server = client.layout.role(client.layout.server_for(key))
            raise PeerError(
                f"{server} does not hold {_name(key)}, so rank 0 cannot write it into "
                f"checkpoint version {version} (without a shared disk the servers hold them all)"
            )
        checkpoint.save_partition(key[0], key[1], version, table.emb, table.state)


class BufferedEventLog(EventLog):
    """An event log kept in memory until :meth:`take` (a trainer's transfers, for rank 0)."""

    def __init__(self) -> None:
        super().__init__(None)
        self._records: list[dict[str, Any]] = []

    def write(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._seq += 1
            self._records.append({"event": event, "seq": self._seq, "time": time.time(), **fields})

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._records = self._records, []
        return out


class TransferRelay:
    """The other trainers' partition-transfer logs, sent to rank 0 with each step's stats.

    ``path_of(rank)``: the file rank 0 appends a trainer's records to. Records keep the time
    and sequence number of the trainer that logged them. A trainer's records of a step that
    never committed (the run failed) are lost with it."""

    def __init__(self, ctx: DistContext, path_of: Callable[[int], Path]) -> None:
        self.ctx = ctx
        self.path_of = path_of
        self.log: EventLog = BufferedEventLog() if ctx.rank != 0 else EventLog(path_of(0))

    def publish(self, version: int) -> None:
        """Rank != 0: hand this step's records to rank 0 (before the "written" barrier)."""
        if isinstance(self.log, BufferedEventLog):
            assert self.ctx.store is not None
            key = f"transfers/{version}/{self.ctx.rank}"
            body = json.dumps(self.log.take(), sort_keys=True)
            store_set(self.ctx.store, key, seal(self.ctx.session, key, body))

    def collect(self, version: int) -> None:
        """Rank 0: append every other trainer's records of this step to its file."""
        store = self.ctx.store
        assert store is not None and self.ctx.rank == 0
        for rank in self.ctx.layout.trainers[1:]:
            key = f"transfers/{version}/{rank}"
            try:
                records = json.loads(unseal(self.ctx.session, key, store.get(key)))
            except BadMac as exc:
                raise PeerError(f"{exc}: not signed with the run's secret") from None
            store.delete_key(key)
            with open(self.path_of(rank), "a", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        self.log.close()
