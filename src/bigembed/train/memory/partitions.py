"""Which embedding partitions are in memory, and swapping them to and from the checkpoint.

Out-of-core rule: only the partitions of the current bucket (plus unpartitioned entity types
and the feature tables of featurized types, which every bucket may need) are resident; a
partition that the next bucket also uses stays. Everything else lives on disk with its
optimizer state. Swapped-out partitions are written as
the in-progress version (see :mod:`bigembed.checkpoints.store`). Three ways to decide what
leaves memory: only the current bucket's partitions (no capacity); a capacity, with evictions
planned from the bucket order (one machine with a memory budget); or ``managed``: the bucket
source says what to give back (:meth:`PartitionStore.write_back`; distributed mode, where the
lock server decides).

Where a partition's value is read from and written to is
:mod:`bigembed.train.memory.partition_values`; which partition leaves to make room is
:mod:`bigembed.train.memory.eviction`; the background threads are
:mod:`bigembed.train.memory.partition_io`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from bigembed.checkpoints import CheckpointStore
from bigembed.errors import BigembedError, PeerError
from bigembed.kernels import Table
from bigembed.partition_keys import PartitionKey
from bigembed.train.memory.eviction import UsePlan
from bigembed.train.memory.partition_io import Job, PartitionIO, TransferTimeout
from bigembed.train.memory.partition_values import (
    PartitionRemote,
    PartitionSource,
    PartitionValues,
    init_embeddings,
)

__all__ = [
    "PartitionKey",
    "PartitionRemote",
    "PartitionSource",
    "PartitionStore",
    "init_embeddings",
]

logger = logging.getLogger(__name__)


class PartitionStore(PartitionValues):
    """The resident partitions, and the swapping of the others to the checkpoint (or remote).

    ``capacity``: how many partitioned tables may be alive at once (resident, being read ahead
    or being written back); ``None`` holds only the current bucket's partitions, swapping
    synchronously (the distributed mode, where the lock server decides what comes next). With
    a capacity, a partition is evicted only to make room, the one used furthest in the future
    (:meth:`plan` gives the future; without it, the least recently used). ``background``
    writes evicted partitions back and reads the next bucket's partitions in background threads
    while the current bucket trains (see :mod:`bigembed.train.memory.partition_io`).

    ``managed`` (distributed mode): :meth:`ensure` evicts nothing; the bucket source gives
    partitions back with :meth:`write_back` (and releases their locks once written) and, with
    ``background``, plans the next bucket (:meth:`plan`) so its partitions are read ahead.
    ``deadline``: the longest the training thread waits for one background read or write-back
    (None: no limit); ``on_event``: called with each event (see ``events``) as it happens.

    ``on_release`` (set by the training loop to its Hogwild pool's ``forget``): called in the
    training thread with each partition (key, table) taken out of the resident set; the
    callable it returns is called once the table is written back and before it counts as freed
    (the Hogwild workers keep the tables they were sent mapped until then; see
    :mod:`bigembed.train.hogwild.cache`).
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
        pinned: Iterable[PartitionKey] = (),
        remote: PartitionRemote | None = None,
        capacity: int | None = None,
        background: bool = False,
        record_events: bool = False,
        managed: bool = False,
        deadline: float | None = None,
        on_event: Callable[[str, PartitionKey], None] | None = None,
    ) -> None:
        super().__init__(
            counts,
            dims,
            checkpoint,
            committed=committed,
            working=working,
            init_source=init_source,
            init_scale=init_scale,
            seed=seed,
            shared=shared,
            remote=remote,
        )
        self.pinned = set(pinned)
        self.capacity = capacity
        self.managed = managed
        self.deadline = deadline
        self.on_event = on_event
        self.on_release: Callable[[PartitionKey, Table], Callable[[], None]] | None = None
        self.loaded: dict[PartitionKey, Table] = {}
        self.dirty: set[PartitionKey] = set()
        self.peak_bytes = 0
        #: partitions brought in (read or initialised) over the run
        self.loads = 0
        #: seconds the training thread waited for partition I/O in :meth:`ensure`
        self.io_wait_seconds = 0.0
        #: most partitioned tables allocated at once (resident, read ahead, not yet written back)
        self.peak_tables = 0
        self._tables = 0
        #: partitions whose read was started ahead, while an earlier bucket trained
        self.reads_ahead = 0
        #: ("write_queued" | "write_end" | "load_start" | "load_end", key) in order, if recorded
        self.events: list[tuple[str, PartitionKey]] | None = [] if record_events else None
        self._writer = PartitionIO(background)
        self._reader = PartitionIO(background)
        self._writing: dict[PartitionKey, Job] = {}
        self._reading: dict[PartitionKey, Job] = {}
        self._uses = UsePlan()

    # ------------------------------------------------------------------ bookkeeping
    def loaded_bytes(self) -> int:
        return sum(t.emb.numel() * 4 + t.state.numel() * 4 for t in self.loaded.values())

    def _event(self, kind: str, key: PartitionKey) -> None:
        if self.events is not None:
            with self._lock:
                self.events.append((kind, key))
        if self.on_event is not None:
            self.on_event(kind, key)

    def _wait(self, job: Job, take: bool = False) -> Any:
        """A background job's result, within the deadline (a PeerError naming it if not)."""
        try:
            return job.take(self.deadline) if take else job.result(self.deadline)
        except TransferTimeout:
            raise PeerError(
                f"a partition transfer (background read or write-back) did not finish within "
                f"{self.deadline:g}s"
            ) from None

    def _alive(self) -> int:
        """Partitioned tables in memory or about to be: resident, being read, being written."""
        self._reap()
        resident = sum(1 for k in self.loaded if k not in self.pinned)
        return resident + len(self._reading) + len(self._writing)

    def _reap(self) -> None:
        for key, job in list(self._writing.items()):
            if job.done():
                del self._writing[key]
                job.result()  # re-raise a failed write-back here, in the training thread

    def _count_table(self, key: PartitionKey, delta: int) -> None:
        if key in self.pinned:
            return
        with self._lock:
            self._tables += delta
            self.peak_tables = max(self.peak_tables, self._tables)

    def _note_peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.loaded_bytes())

    # ------------------------------------------------------------------ load / save
    def _load_logged(self, key: PartitionKey) -> Table:
        self._event("load_start", key)
        table = self._load(key)
        with self._lock:
            self.loads += 1
        self._count_table(key, 1)
        self._event("load_end", key)
        return table

    def _write_back(self, key: PartitionKey) -> None:
        """Take ``key`` out of the resident set and queue its write-back."""
        table = self.loaded.pop(key)
        self.dirty.discard(key)
        self._event("write_queued", key)
        released = self.on_release(key, table) if self.on_release is not None else None

        def write() -> None:
            self._save(key, table)
            if released is not None:
                released()  # no worker maps it any more
            self._count_table(key, -1)
            self._event("write_end", key)

        self._writing[key] = self._writer.submit(write)

    def _read_after(self, key: PartitionKey) -> list[Job]:
        """The write-backs a read of ``key`` must wait for: its own (a partition is never read
        before its write-back is complete) and, if the budget is full, those that free room."""
        self._reap()
        after = [self._writing[key]] if key in self._writing else []
        if self.capacity is not None and self._alive() + 1 > self._room():
            after += [j for k, j in self._writing.items() if k != key]
        return after

    def _room(self) -> int:
        return self.capacity if self.capacity is not None else 0

    # ------------------------------------------------------------------ planning
    def plan(self, future: Sequence[Iterable[PartitionKey]]) -> None:
        """The partitions of the buckets to come, in order; :meth:`ensure` takes them one by
        one, evicts the partition needed furthest ahead and reads the next bucket's early."""
        self._uses.plan(
            [
                frozenset(s for s in map(self.table_key, keys) if s not in self.pinned)
                for keys in future
            ]
        )

    def _victim(
        self, protect: set[PartitionKey], at: int | None = None, reading: bool = False
    ) -> PartitionKey | None:
        """The resident partition to evict (see :mod:`bigembed.train.memory.eviction`; from the
        planned bucket ``at``, by default the next one; ``reading``: the partitions being read
        ahead count as resident)."""
        held = [*self.loaded, *self._reading] if reading else list(self.loaded)
        candidates = [k for k in held if k not in protect and k not in self.pinned]
        return self._uses.victim(candidates, at)

    def _make_room(self, protect: set[PartitionKey]) -> bool:
        """Evict until one more table fits in the capacity (counting tables being written back,
        which the new one will wait for); False if only protected partitions are left."""
        while self._alive() - len(self._writing) + 1 > self._room():
            victim = self._victim(protect)
            if victim is None and self._reading:  # read ahead for later buckets: evictable now
                for key, job in sorted(self._reading.items()):
                    self.loaded[key] = self._wait(job, take=True)
                self._reading.clear()
                continue
            if victim is None:
                return False
            self._write_back(victim)
        return True

    # ------------------------------------------------------------------ load / save
    def get(self, key: PartitionKey) -> Table:
        return self.view(key, self.loaded[self.table_key(key)])

    def read(self, key: PartitionKey) -> Table:
        """A partition's current value in a fresh table, without making it resident."""
        self.drain()
        return self._load(key)

    def drain(self) -> None:
        """Wait for every background read and write-back (re-raising their errors)."""
        try:
            self._writer.drain(self.deadline)
            self._reader.drain(self.deadline)
        except TransferTimeout:
            raise PeerError(
                f"background partition transfers did not finish within {self.deadline:g}s"
            ) from None
        self._reap()

    def check(self) -> None:
        """Re-raise the error of a background job that failed (waits for nothing)."""
        self._reap()
        self._writer.check()
        self._reader.check()

    def write_back(
        self, keys: Iterable[PartitionKey], then: Callable[[list[PartitionKey]], None]
    ) -> None:
        """Give ``keys`` back: write each resident one back (in the background with background
        I/O) and call ``then(keys)`` once all those write-backs (and any read of them still
        running) are complete: the lock client's release, so that nobody can read a partition
        before its write-back is complete. Errors surface in :meth:`check` / :meth:`drain`."""
        out = sorted(k for k in keys if self.table_key(k) not in self.pinned)
        after: list[Job] = []
        for key in out:
            reading = self._reading.pop(key, None)
            if reading is not None:  # read ahead, then given back unused: clean, drop it
                self._wait(reading, take=True)
                self._count_table(key, -1)
            if key in self.loaded:
                self._write_back(key)
            if key in self._writing:
                after.append(self._writing[key])
        self._writer.submit(partial(then, out), after)

    def evict(self, keep: Iterable[PartitionKey] = ()) -> list[PartitionKey]:
        """Swap out every resident partition except ``keep`` and the pinned ones, and wait for
        the write-backs (the lock client releases them next); returns them."""
        want = set(map(self.table_key, keep)) | self.pinned
        self._drop_reads(want)
        out = sorted(set(self.loaded) - want)
        for key in out:
            self._write_back(key)
        self.drain()
        return out

    def _drop_reads(self, keep: set[PartitionKey]) -> None:
        for key in [k for k in self._reading if k not in keep]:
            self._reading.pop(key).take()
            self._count_table(key, -1)

    def ensure(self, needed: Iterable[PartitionKey]) -> dict[PartitionKey, Table]:
        """Make ``needed`` (plus pinned partitions) resident and return their tables.

        Without a capacity every other partition is swapped out first. With one, others stay
        until their room is needed; if :meth:`plan` gave the future, this call takes the next
        planned bucket and then starts reading the ones after it in the background
        (:meth:`_prefetch`).
        """
        started = time.perf_counter()
        needed = set(needed)
        want = set(map(self.table_key, needed)) | self.pinned
        if self.capacity is None and not self.managed:
            self.evict(want)
        for key in sorted(want & set(self._reading)):  # read ahead for this bucket
            self.loaded[key] = self._wait(self._reading.pop(key), take=True)
        if self.capacity is None:  # read ahead for a bucket that did not come: evictable
            for key, job in sorted(self._reading.items()):
                self.loaded[key] = self._wait(job, take=True)
            self._reading.clear()
        for key in sorted(want - set(self.loaded)):
            room = self.capacity is None or key in self.pinned or self._make_room(want)
            if not room:
                raise BigembedError(
                    f"partition capacity {self.capacity} is smaller than one bucket's "
                    f"{len(want - self.pinned)} partitions"
                )
            for dep in self._read_after(key):
                self._wait(dep)
            self.loaded[key] = self._load_logged(key)
            self._note_peak()
        self.dirty |= want
        self._uses.used(want)
        self._note_peak()
        self.io_wait_seconds += time.perf_counter() - started
        self._prefetch(want)
        return {k: self.get(k) for k in want | needed}

    def _prefetch(self, current: set[PartitionKey]) -> None:
        """Start reading the partitions of the planned buckets to come, in their order, as
        far as the capacity allows without changing which partitions are swapped: a
        partition is evicted early only if it is the one :meth:`ensure` would evict for that
        bucket and no bucket before it needs it (so its write-back and the read overlap the
        buckets in between). Without a capacity, only the next bucket's are read."""
        if (
            (self.capacity is None and not self.managed)
            or not self._reader.background
            or self._uses.cursor >= len(self._uses.future)
        ):
            return
        if self.capacity is None:
            upcoming = self._uses.future[self._uses.cursor]
            for key in sorted(upcoming - set(self.loaded) - set(self._reading)):
                self._read_ahead(key)
            return
        needed = set(current)  # used from now until the bucket being looked at
        for at in range(self._uses.cursor, len(self._uses.future)):
            bucket = self._uses.future[at]
            for key in sorted(bucket - set(self.loaded) - set(self._reading)):
                while self._alive() - len(self._writing) + 1 > self._room():
                    victim = self._victim(set(bucket), at, reading=True)
                    if victim is None or victim in needed or victim in self._reading:
                        return  # that eviction must wait until its partition is done
                    self._write_back(victim)
                self._read_ahead(key)
            needed |= bucket

    def _read_ahead(self, key: PartitionKey) -> None:
        self._reading[key] = self._reader.submit(
            partial(self._load_logged, key), self._read_after(key)
        )
        self.reads_ahead += 1
        self._note_peak()

    def flush(self) -> None:
        """Write every resident partition as the working version and carry the others over."""
        self.drain()
        for key, job in sorted(self._reading.items()):
            self.loaded[key] = job.take()
        self._reading.clear()
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
        self.drain()
        self.committed = committed
        self.working = working

    def release_all(self) -> None:
        self.drain()
        self._reading.clear()
        self.loaded.clear()
        self._views.clear()
        self._tables = 0
        self.close()

    def close(self) -> None:
        """Stop the background threads (after the jobs already queued)."""
        self._writer.close()
        self._reader.close()
