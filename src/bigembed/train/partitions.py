"""Which embedding partitions are in memory, and swapping them to and from the checkpoint.

Out-of-core rule: only the partitions of the current bucket (plus unpartitioned entity types,
which every bucket needs) are resident; a partition that the next bucket also uses stays.
Everything else lives on disk with its optimizer state. Swapped-out partitions are written as
the in-progress version (see :mod:`bigembed.checkpoints.store`).

Tables are allocated in shared memory when Hogwild workers need them. Running out of
``/dev/shm`` kills a process with SIGBUS (PBG's most reported crash), so the free space is
checked before each allocation and reported as a clear error instead.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from bigembed.checkpoints.store import CheckpointStore
from bigembed.errors import BigembedError, CheckpointError
from bigembed.partition_keys import PartitionKey
from bigembed.train.step import Table

logger = logging.getLogger(__name__)


def _seed_for(seed: int, etype: str, part: int) -> int:
    h = 1469598103934665603
    for ch in f"{seed}/{etype}/{part}".encode():
        h = ((h ^ ch) * 1099511628211) % (1 << 63)
    return h


def init_embeddings(
    count: int, dim: int, init_scale: float, seed: int, etype: str, part: int
) -> torch.Tensor:
    """N(0, 1) * init_scale, reproducible from (seed, type, partition)."""
    gen = torch.Generator().manual_seed(_seed_for(seed, etype, part))
    return torch.randn((count, dim), generator=gen).mul_(init_scale)


@dataclass
class PartitionSource:
    """Where a partition is read from when it is first needed in this run."""

    store: CheckpointStore
    version: int


class PartitionRemote(Protocol):
    """Where swapped-out partitions live instead of the checkpoint directory (distributed mode:
    the partition servers). A partition the remote does not hold is read from disk as usual."""

    def fetch(self, key: PartitionKey, out_emb: torch.Tensor, out_state: torch.Tensor) -> bool: ...

    def store(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None: ...


class PartitionStore:
    def __init__(
        self,
        counts: dict[PartitionKey, int],
        dims: dict[str, int],
        checkpoint: CheckpointStore,
        *,
        committed: int,
        working: int,
        init_source: PartitionSource | None,
        init_scale: float,
        seed: int,
        shared: bool,
        pinned: Iterable[PartitionKey] = (),
        remote: PartitionRemote | None = None,
    ) -> None:
        self.counts = counts
        self.dims = dims
        self.checkpoint = checkpoint
        self.committed = committed
        self.working = working
        self.init_source = init_source
        self.init_scale = init_scale
        self.seed = seed
        self.shared = shared
        self.pinned = set(pinned)
        self.remote = remote
        self.loaded: dict[PartitionKey, Table] = {}
        self.dirty: set[PartitionKey] = set()
        self.peak_bytes = 0
        self.bytes_read = 0
        self.bytes_written = 0

    # ------------------------------------------------------------------ bookkeeping
    def table_bytes(self, key: PartitionKey) -> int:
        return self.counts[key] * (self.dims[key[0]] + 1) * 4

    def total_bytes(self) -> int:
        return sum(self.table_bytes(k) for k in self.counts)

    def loaded_bytes(self) -> int:
        return sum(t.emb.numel() * 4 + t.state.numel() * 4 for t in self.loaded.values())

    def _allocate(self, key: PartitionKey) -> Table:
        count, dim = self.counts[key], self.dims[key[0]]
        if self.shared:
            need = self.table_bytes(key)
            try:
                free = shutil.disk_usage("/dev/shm").free
            except OSError:
                free = None
            if free is not None and need > free:
                raise BigembedError(
                    f"not enough shared memory for partition {key[1]} of '{key[0]}': needs "
                    f"{need / 2**20:.0f} MiB, /dev/shm has {free / 2**20:.0f} MiB free "
                    "(raise its size, e.g. docker --shm-size, or use more partitions)"
                )
            emb = torch.empty((count, dim)).share_memory_()
            state = torch.zeros(count).share_memory_()
        else:
            emb = torch.empty((count, dim))
            state = torch.zeros(count)
        return Table(emb, state)

    # ------------------------------------------------------------------ load / save
    def _load(self, key: PartitionKey) -> Table:
        """A partition's latest value: this run's working version, else the committed one.

        With a committed checkpoint every partition must be in it: a missing file is an error,
        never a silent re-initialisation (its trained rows would be lost). File headers are
        checked against the entity count and dimension before anything is allocated.
        """
        etype, part = key
        count, dim = self.counts[key], self.dims[etype]
        ck = self.checkpoint
        table: Table | None = None
        if self.remote is not None:
            table = self._allocate(key)
            if self.remote.fetch(key, table.emb, table.state):
                self.bytes_read += self.table_bytes(key)
                return table
        source: tuple[CheckpointStore, int, bool] | None = None
        if ck.has_partition(etype, part, self.working):
            source = (ck, self.working, True)
        elif self.committed > 0:
            if not ck.has_partition(etype, part, self.committed):
                raise CheckpointError(
                    f"{ck.embeddings_path(etype, part, self.committed)}: missing from checkpoint "
                    f"version {self.committed} (partition {part} of '{etype}'; training on would "
                    "re-initialise it and lose its trained rows); restore the file, or train into "
                    "a new checkpoint_path"
                )
            source = (ck, self.committed, True)
        elif self.init_source is not None and self.init_source.store.has_partition(
            etype, part, self.init_source.version
        ):
            source = (self.init_source.store, self.init_source.version, False)
        if source is not None:
            store, version, own = source
            store.check_partition(etype, part, version, count, dim)
        if table is None:
            table = self._allocate(key)
        if source is None:
            table.emb.copy_(init_embeddings(count, dim, self.init_scale, self.seed, etype, part))
            table.state.zero_()
            return table
        store, version, own = source
        store.load_partition(etype, part, version, table.emb, table.state, require_state=own)
        if not own:
            table.state.zero_()  # warm start: parameters yes, optimizer state no
        self.bytes_read += self.table_bytes(key)
        return table

    def _save(self, key: PartitionKey, table: Table) -> None:
        if self.remote is not None:
            self.remote.store(key, table.emb, table.state)
        else:
            self.checkpoint.save_partition(key[0], key[1], self.working, table.emb, table.state)
        self.bytes_written += self.table_bytes(key)

    def get(self, key: PartitionKey) -> Table:
        return self.loaded[key]

    def read(self, key: PartitionKey) -> Table:
        """A partition's current value in a fresh table, without making it resident."""
        return self._load(key)

    def evict(self, keep: Iterable[PartitionKey] = ()) -> list[PartitionKey]:
        """Swap out every resident partition except ``keep`` and the pinned ones; returns them."""
        want = set(keep) | self.pinned
        out = sorted(set(self.loaded) - want)
        for key in out:
            table = self.loaded.pop(key)
            self._save(key, table)
            self.dirty.discard(key)
        return out

    def ensure(self, needed: Iterable[PartitionKey]) -> dict[PartitionKey, Table]:
        """Make exactly ``needed`` (plus pinned partitions) resident; swap the rest out."""
        want = set(needed) | self.pinned
        self.evict(want)
        for key in sorted(want - set(self.loaded)):
            self.loaded[key] = self._load(key)
        self.dirty |= want
        self.peak_bytes = max(self.peak_bytes, self.loaded_bytes())
        return {k: self.loaded[k] for k in want}

    def flush(self) -> None:
        """Write every resident partition as the working version and carry the others over."""
        for key, table in sorted(self.loaded.items()):
            self._save(key, table)
        self.dirty.clear()
        for key in sorted(self.counts):
            etype, part = key
            if not self.checkpoint.has_partition(etype, part, self.working):
                if self.committed > 0 and self.checkpoint.has_partition(
                    etype, part, self.committed
                ):
                    self.checkpoint.link_partition(etype, part, self.committed, self.working)
                else:
                    # Never touched yet (e.g. its edges come in a later edge set): materialise it.
                    table = self._load(key)
                    self._save(key, table)

    def advance(self, committed: int, working: int) -> None:
        self.committed = committed
        self.working = working

    def release_all(self) -> None:
        self.loaded.clear()
