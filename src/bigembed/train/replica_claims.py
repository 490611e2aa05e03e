"""Replicas take each other's unstarted batches at the end of a bucket (``communication.
replica_stealing``): the cross-replica form of a trainer's work stealing.

The sampler (:mod:`bigembed.train.replica_share`) gives every replica batches of the same
*expected* cost, but replicas do not run at the same speed: a virtual machine's cores drift by
tens of percent from minute to minute, a host runs other work, one machine of a cluster is
older. With a fixed split the bucket ends when the slowest replica does, and the others wait
at the agreement. With stealing every replica still trains its own share first and in the
sampler's order, and a replica that is done takes the next unstarted batch of another
replica's share (the one with the most left) instead of waiting.

Claims go through one counter per share in the run's store (``store.add``, atomic): the
counter is the number of the share's batches taken, by anybody, so each batch is taken exactly
once whoever takes it. The owner claims guided chunks (guided self-scheduling): a
``1 / (GUIDE * replicas)`` part of what its share has left, at least ``chunk`` batches, so a
share of ``n`` batches costs its owner ~``GUIDE * replicas * ln(n / chunk)`` store round trips
instead of ``n / chunk`` (each a few milliseconds when the store's host is busy training, with
the worker idle meanwhile), and what the owner holds unstarted, out of the others' reach,
shrinks with what is left: at most ``chunk - 1`` batches at the end. A thief takes one batch at
a time. Every replica knows every share (the same plan and sampler everywhere),
so a stolen batch is read from the replica's own copy of the bucket's edges: only the counter
crosses the network.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Protocol

#: The fewest batches the owner of a share claims per store round trip.
OWNER_CHUNK = 2
#: The owner claims at most ``1 / (GUIDE * replicas)`` of its share's unclaimed batches at once.
GUIDE = 2


class CounterStore(Protocol):
    """The part of a ``torch.distributed.Store`` the claims use."""

    def add(self, key: str, value: int) -> int: ...

    def delete_key(self, key: str) -> bool: ...


class ReplicaClaims:
    """One replica's batches of one bucket, taken through the store's counters.

    ``sizes[j]``: how many batches replica ``j``'s share holds; iterating yields positions in
    the concatenation of the shares (share 0's batches, then share 1's, ...): this replica's
    own share first, in order, then batches taken from the others.
    """

    def __init__(
        self,
        store: CounterStore,
        prefix: str,
        sizes: Sequence[int],
        replica: int,
        chunk: int = OWNER_CHUNK,
    ) -> None:
        if not 0 <= replica < len(sizes):
            raise ValueError(f"replica {replica} of {len(sizes)}")
        self.store = store
        self.keys = [f"{prefix}/{j}" for j in range(len(sizes))]
        self.sizes = list(sizes)
        self.replica = replica
        self.chunk = max(1, chunk)
        self.offsets = [sum(self.sizes[:j]) for j in range(len(sizes))]
        #: earlier buckets' claims to release when this one starts (from the training thread,
        #: the one that uses the store, once every replica is certainly done with them)
        self.release_first: list[ReplicaClaims] = []

    def __iter__(self) -> Iterator[int]:
        for done in self.release_first:
            done.release()
        self.release_first = []
        me, size = self.replica, self.sizes[self.replica]
        take = self.owner_chunk(size)
        while True:  # the own share, a guided chunk per round trip
            end = self.store.add(self.keys[me], take)
            start = end - take
            if start >= size:
                break
            for position in range(start, min(end, size)):
                yield self.offsets[me] + position
            take = self.owner_chunk(size - end)
        while True:  # then the share with the most left, one batch at a time
            left = {
                j: self.sizes[j] - self.store.add(self.keys[j], 0)
                for j in range(len(self.sizes))
                if j != me
            }
            victim = max(left, key=lambda j: left[j], default=None)
            if victim is None or left[victim] <= 0:
                return
            while True:
                position = self.store.add(self.keys[victim], 1) - 1
                if position >= self.sizes[victim]:
                    break
                yield self.offsets[victim] + position

    def owner_chunk(self, left: int) -> int:
        """How many of its own share's ``left`` unclaimed batches the owner claims next."""
        return max(self.chunk, math.ceil(left / (GUIDE * len(self.sizes))))

    def release(self) -> None:
        """Delete this replica's counter (call once every replica is done with the bucket)."""
        self.store.delete_key(self.keys[self.replica])
