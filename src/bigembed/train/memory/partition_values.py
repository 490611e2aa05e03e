"""A partition's value: where it is read from, where it is written, and its table.

A partition is read from this run's working version, else the committed one (with a committed
checkpoint every partition must be in it), else the warm-start source (parameters only), else
initialised from the seed; in distributed mode the remote (the partition servers) is asked
first. It is written to the remote, or as the working version to the checkpoint directory.

A featurized type has one stored table (its features, as partition 0) whatever its number of
partitions: each of its partitions is that table with its own bags (:meth:`PartitionValues.view`),
so the feature table is read, swapped and written like an unpartitioned type's.

Tables are allocated in shared memory when Hogwild workers need them. Running out of
``/dev/shm`` kills a process with SIGBUS (PBG's most reported crash), so the free space is
checked before each allocation and reported as a clear error instead.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from typing import Protocol

import torch

from bigembed.checkpoints import CheckpointStore
from bigembed.errors import BigembedError, CheckpointError
from bigembed.kernels import Table
from bigembed.model import FeatureBags
from bigembed.partition_keys import PartitionKey


def _seed_for(seed: int, etype: str, part: int) -> int:
    h = 1469598103934665603
    for ch in f"{seed}/{etype}/{part}".encode():
        h = ((h ^ ch) * 1099511628211) % (1 << 63)
    return h


def init_embeddings(
    count: int,
    dim: int,
    init_scale: float,
    seed: int,
    etype: str,
    part: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """N(0, 1) * init_scale, reproducible from (seed, type, partition); written into ``out``
    if given (no second copy of the table in memory)."""
    gen = torch.Generator().manual_seed(_seed_for(seed, etype, part))
    if out is None:
        out = torch.empty((count, dim))
    torch.randn((count, dim), generator=gen, out=out)
    return out.mul_(init_scale)


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


class PartitionValues:
    """Reads and writes whole partitions (see the module docstring); counts the bytes moved.

    ``counts`` and ``dims``: each partition's rows and each entity type's dimension;
    ``committed`` / ``working``: the checkpoint version read from and the one being written;
    ``init_source``: the warm start; ``shared``: tables in shared memory (Hogwild workers).
    :class:`~bigembed.train.memory.partitions.PartitionStore` builds residency on top of it.
    """

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
        self.remote = remote
        self.bytes_read = 0
        self.bytes_written = 0
        #: partitions written back over the run
        self.writes = 0
        self._lock = threading.Lock()  # the counters are updated from I/O threads too
        #: the feature bags of featurized partitions (their tables hold feature rows)
        self.bags: dict[PartitionKey, FeatureBags] = {}
        self._views: dict[PartitionKey, Table] = {}

    def table_key(self, key: PartitionKey) -> PartitionKey:
        """The stored table partition ``key`` uses: its own, or (a partition of a featurized
        type that is not in ``counts``) its type's one feature table, partition 0."""
        return key if key in self.counts or key not in self.bags else (key[0], 0)

    def view(self, key: PartitionKey, stored: Table) -> Table:
        """Partition ``key`` over the table ``stored`` holds for it: the stored table itself, or
        for a featurized partition sharing its type's feature table, that table with the
        partition's own bags (one view object per table, so the Hogwild workers are sent it
        once)."""
        if self.table_key(key) == key:
            return stored
        view = self._views.get(key)
        if view is None or view.emb is not stored.emb:
            view = self._views[key] = Table(stored.emb, stored.state, self.bags[key])
        return view

    def table_bytes(self, key: PartitionKey) -> int:
        return self.counts[key] * (self.dims[key[0]] + 1) * 4

    def total_bytes(self) -> int:
        return sum(self.table_bytes(k) for k in self.counts)

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
        return Table(emb, state, self.bags.get(key))

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
                with self._lock:
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
            init_embeddings(count, dim, self.init_scale, self.seed, etype, part, out=table.emb)
            table.state.zero_()
            return table
        store, version, own = source
        store.load_partition(etype, part, version, table.emb, table.state, require_state=own)
        if not own:
            table.state.zero_()  # warm start: parameters yes, optimizer state no
        with self._lock:
            self.bytes_read += self.table_bytes(key)
        return table

    def _save(self, key: PartitionKey, table: Table) -> None:
        if self.remote is not None:
            self.remote.store(key, table.emb, table.state)
        else:
            self.checkpoint.save_partition(key[0], key[1], self.working, table.emb, table.state)
        with self._lock:
            self.bytes_written += self.table_bytes(key)
            self.writes += 1
