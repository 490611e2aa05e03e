"""The trainer's side of the lock server: a BucketSource that asks rank 0 for every bucket.

Each request reports the bucket just trained and asks to hold one bucket (or, with
``partition_prefetch``, two: the one to train and the next). The reply's ``release`` list is
given back through the partition store: written back (in the background with
``partition_prefetch``), and released only once those write-backs are complete, so nobody can
read a stale copy. With a next bucket known, the store reads its partitions while the current
one trains. "wait" (nothing to train): give everything back, ask again after a short, growing
pause; "done": the pass has nothing left for this trainer; wait for the transfers, return.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import partial

import torch.distributed as dist

from bigembed.distributed.auth import Session
from bigembed.distributed.lock_server import CHANNEL
from bigembed.distributed.rpc import RpcClient
from bigembed.partition_keys import Bucket, PartitionKey
from bigembed.train import Iteration, PartitionStore

logger = logging.getLogger(__name__)


class LockClient:
    def __init__(
        self,
        store: dist.Store,
        trainer: int,
        timeout: float,
        peer: str,
        session: Session | None = None,
    ) -> None:
        self.trainer = trainer
        self.rpc = RpcClient(store, CHANNEL, timeout, peer, session)

    def acquire(self, iteration: int, finished: Bucket | None, want: int = 1) -> dict:
        return self.rpc.call(
            {
                "op": "acquire",
                "trainer": self.trainer,
                "iteration": iteration,
                "finished": list(finished) if finished is not None else None,
                "want": want,
            }
        )

    def release(self, iteration: int, keys: list[PartitionKey]) -> None:
        if keys:
            self.rpc.call(
                {
                    "op": "release",
                    "trainer": self.trainer,
                    "iteration": iteration,
                    "keys": [[t, p] for t, p in keys],
                }
            )


class LockedBucketSource:
    """BucketSource for the distributed trainer (see :class:`bigembed.train.loop.BucketSource`).

    ``releases``: the lock client that sends the releases (from the store's write-back thread
    when it runs in the background: give it its own store connection); ``lookahead``: hold the
    next bucket too and read its partitions while the current one trains."""

    def __init__(
        self,
        client: LockClient,
        keys_of: Callable[[Bucket], frozenset[PartitionKey]],
        partitions: PartitionStore,
        min_pause: float = 0.05,
        max_pause: float = 1.0,
        *,
        releases: LockClient | None = None,
        lookahead: bool = False,
    ) -> None:
        self.client = client
        self.releases = releases or client
        self.keys_of = keys_of
        self.store = partitions  # written back and released between buckets
        self.min_pause = min_pause
        self.max_pause = max_pause
        self.lookahead = lookahead
        self.waits = 0

    def _give_back(self, iteration: int, release: list[list]) -> None:
        keys: list[PartitionKey] = [(str(t), int(p)) for t, p in release]
        self.store.write_back(keys, partial(self.releases.release, iteration))

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]:
        del nparts_lhs, nparts_rhs  # the lock server knows the buckets
        finished: Bucket | None = None
        queue: list[Bucket] = []  # granted, not yet trained (the one to train first)
        pause = self.min_pause
        while True:
            self.store.check()  # a background transfer that failed stops the run here
            reply = self.client.acquire(it.index, finished, 2 if self.lookahead else 1)
            finished = None
            self._give_back(it.index, reply["release"])
            queue += [(int(b[0]), int(b[1])) for b in reply.get("granted", [])]
            if not queue:
                if reply["kind"] == "done":
                    self.store.drain()  # every write-back complete and released
                    return
                self.waits += 1
                time.sleep(pause)
                pause = min(pause * 2, self.max_pause)
                continue
            pause = self.min_pause
            bucket = queue.pop(0)
            if self.lookahead:  # the store reads the next bucket's partitions as this trains
                self.store.plan([self.keys_of(b) for b in (bucket, *queue)])
            yield bucket
            finished = bucket
