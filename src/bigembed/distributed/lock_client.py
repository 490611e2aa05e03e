"""The trainer's side of the lock server: a BucketSource that asks rank 0 for every bucket.

Between two buckets it writes back the partitions the next bucket does not need and releases
them (in that order, so nobody can read a stale copy), then hands the bucket to the training
loop, which loads what is missing. "wait" means: write everything back, release it, ask again
after a short, growing pause; "done" means the pass has nothing left for this trainer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import torch.distributed as dist

from bigembed.distributed.auth import Session
from bigembed.distributed.lock_server import CHANNEL
from bigembed.distributed.rpc import RpcClient
from bigembed.partition_keys import Bucket, PartitionKey
from bigembed.train.iteration import Iteration
from bigembed.train.partitions import PartitionStore

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

    def acquire(self, iteration: int, finished: Bucket | None) -> dict:
        return self.rpc.call(
            {
                "op": "acquire",
                "trainer": self.trainer,
                "iteration": iteration,
                "finished": list(finished) if finished is not None else None,
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
    """BucketSource for the distributed trainer (see :class:`bigembed.train.loop.BucketSource`)."""

    def __init__(
        self,
        client: LockClient,
        keys_of: Callable[[Bucket], frozenset[PartitionKey]],
        partitions: PartitionStore,
        min_pause: float = 0.05,
        max_pause: float = 1.0,
    ) -> None:
        self.client = client
        self.keys_of = keys_of
        self.store = partitions  # written back and released between buckets
        self.min_pause = min_pause
        self.max_pause = max_pause
        self.waits = 0

    def _give_back(self, iteration: int, keep: frozenset[PartitionKey]) -> None:
        evicted = self.store.evict(keep)
        locked = [k for k in evicted if k not in self.store.pinned]
        self.client.release(iteration, locked)

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]:
        del nparts_lhs, nparts_rhs  # the lock server knows the buckets
        finished: Bucket | None = None
        pause = self.min_pause
        while True:
            reply = self.client.acquire(it.index, finished)
            finished = None
            kind = reply["kind"]
            if kind == "bucket":
                bucket = (int(reply["bucket"][0]), int(reply["bucket"][1]))
                self._give_back(it.index, self.keys_of(bucket))
                pause = self.min_pause
                yield bucket
                finished = bucket
            elif kind == "wait":
                self._give_back(it.index, frozenset())
                self.waits += 1
                time.sleep(pause)
                pause = min(pause * 2, self.max_pause)
            else:
                self._give_back(it.index, frozenset())
                return
