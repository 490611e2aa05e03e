"""Which resident partition leaves to make room: the one needed furthest ahead.

When the bucket order is known in advance, the partition store is given the partitions of the
buckets to come (:meth:`UsePlan.plan`) and evicts the partition whose next use is furthest away
(Belady's choice, optimal for a known sequence); partitions used by no planned bucket come
first, and ties (or no plan) go to the least recently used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bigembed.partition_keys import PartitionKey


class UsePlan:
    """The planned buckets still to come (from ``cursor``) and each partition's last use."""

    def __init__(self) -> None:
        #: the partitioned keys of each planned bucket, in order
        self.future: list[frozenset[PartitionKey]] = []
        #: the index in ``future`` of the next bucket to be made resident
        self.cursor = 0
        self._last_use: dict[PartitionKey, int] = {}
        self._clock = 0

    def plan(self, future: Sequence[frozenset[PartitionKey]]) -> None:
        """Replace the buckets to come."""
        self.future = list(future)
        self.cursor = 0

    def used(self, keys: Iterable[PartitionKey]) -> None:
        """``keys`` were made resident for the next bucket: it is no longer to come."""
        self._clock += 1
        for key in keys:
            self._last_use[key] = self._clock
        if self.future and self.cursor < len(self.future):
            self.cursor += 1

    def next_use(self, key: PartitionKey, start: int | None = None) -> float:
        """The index of the first planned bucket from ``start`` (default: the next) using
        ``key``; infinity if none does."""
        for i in range(self.cursor if start is None else start, len(self.future)):
            if key in self.future[i]:
                return i
        return float("inf")

    def victim(
        self, candidates: Iterable[PartitionKey], at: int | None = None
    ) -> PartitionKey | None:
        """The candidate to evict: needed furthest ahead from the planned bucket ``at`` (by
        default the next one), else least recently used; None if there is no candidate."""
        keys = sorted(candidates)
        if not keys:
            return None
        return max(keys, key=lambda k: (self.next_use(k, at), -self._last_use.get(k, -1)))
