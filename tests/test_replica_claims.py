"""Replicas taking each other's batches (``communication.replica_stealing``).

Through a real ``torch.distributed`` store shared by threads (the counters are the protocol):
every batch of every share is trained exactly once whoever takes it, each replica starts with
its own share in the sampler's order, a replica that is done takes the unstarted batches of
the one with the most left, a slow replica is relieved of its tail; and a replica's
:class:`~bigembed.train.ReplicaShare` with a store prepares every share of the bucket.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bigembed.train import Iteration, ReplicaShare
from bigembed.train.replica_claims import ReplicaClaims
from support.graphs import graph_config


def _store() -> dist.Store:
    return dist.HashStore()


def _take(
    store: dist.Store, sizes: list[int], seconds: list[float], chunk: int = 4
) -> list[list[int]]:
    """Every replica's positions, in the order it trained them, each replica a thread that
    spends ``seconds[r]`` per batch."""
    taken: list[list[int]] = [[] for _ in sizes]

    def replica(r: int) -> None:
        for position in ReplicaClaims(store, "claims/v1/b0-0", sizes, r, chunk=chunk):
            taken[r].append(position)
            time.sleep(seconds[r])

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return taken


def test_every_batch_is_taken_once_and_own_shares_come_first() -> None:
    sizes = [30, 29, 29]
    taken = _take(_store(), sizes, [0.0005, 0.0005, 0.0005])
    everything = sorted(p for t in taken for p in t)
    assert everything == list(range(sum(sizes)))  # each batch once, none lost
    offsets = [0, 30, 59]
    for r, positions in enumerate(taken):
        own = [p - offsets[r] for p in positions if offsets[r] <= p < offsets[r] + sizes[r]]
        assert own == sorted(own)  # its own batches in the sampler's order
        first_foreign = next(
            (k for k, p in enumerate(positions) if not offsets[r] <= p < offsets[r] + sizes[r]),
            len(positions),
        )
        assert first_foreign == len(own)  # nothing taken from others before its own is out


class _CountingStore:
    """A store that counts its round trips."""

    def __init__(self) -> None:
        self.store = _store()
        self.trips = 0

    def add(self, key: str, value: int) -> int:
        self.trips += 1
        return int(self.store.add(key, value))

    def delete_key(self, key: str) -> bool:
        return bool(self.store.delete_key(key))


def test_the_owner_claims_guided_chunks_in_few_round_trips() -> None:
    """A share of 136 batches (FB15k-237's half at batch 1000) costs its owner ~15 store round
    trips, not 136 / chunk: the chunks shrink with what is left, down to ``chunk``."""
    store = _CountingStore()
    claims = ReplicaClaims(store, "claims/v1/b0-0", [136, 136], 0, chunk=2)
    own = list(itertools.islice(iter(claims), 136))
    assert own == list(range(136))
    assert store.trips <= 16, store.trips  # a fixed chunk of 2 would take 68
    assert claims.owner_chunk(136) == 34 and claims.owner_chunk(3) == 2


def test_a_slow_replica_is_relieved_of_its_tail() -> None:
    """Replica 1 is 8x slower: the fast one trains its own share, then most of replica 1's;
    without stealing the bucket would take replica 1's whole share."""
    sizes = [40, 40]
    taken = _take(_store(), sizes, [0.001, 0.008])
    assert sorted(taken[0] + taken[1]) == list(range(80))
    stolen = [p for p in taken[0] if p >= 40]
    assert len(stolen) >= 15, (len(taken[0]), len(taken[1]))
    assert stolen == sorted(stolen)  # taken from the front of the victim's unstarted batches
    assert len(taken[1]) <= 25


def test_a_thief_takes_from_the_share_with_most_left() -> None:
    store = _store()
    sizes = [4, 10, 20]
    store.add("claims/v1/b0-0/1", 9)  # replica 1 has 1 batch left, replica 2 all 20
    thief = iter(ReplicaClaims(store, "claims/v1/b0-0", sizes, 0, chunk=4))
    own = [next(thief) for _ in range(4)]
    assert own == [0, 1, 2, 3]
    assert next(thief) == 14  # share 2's first (offset 4 + 10)
    assert store.add("claims/v1/b0-0/2", 0) == 1


def test_release_deletes_the_replicas_counter_when_a_later_bucket_starts() -> None:
    store = _store()
    old = ReplicaClaims(store, "claims/v1/b0-0", [2, 2], 0)
    assert list(old) == [0, 1, 2, 3]  # alone: its own share, then the other's
    new = ReplicaClaims(store, "claims/v2/b0-0", [2, 2], 0)
    new.release_first = [old]
    store.set_timeout(timedelta(milliseconds=200))
    assert store.check(["claims/v1/b0-0/0"])
    next(iter(new))
    assert not store.check(["claims/v1/b0-0/0"])


class _Pool:
    def prepare_planned(
        self, edges: Any, order: torch.Tensor, plan: np.ndarray, seed: int, claims: Any = None
    ) -> Any:
        return order, plan, claims


class _Job:
    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        self.cfg = graph_config(tmp_path, batch_size=50, dynamic_relations=False, **overrides)

    def partition_counts(self) -> dict[tuple[str, int], int]:
        return {("node", 0): 200}


def test_a_replica_with_a_store_prepares_every_share_and_trains_what_it_claims(
    tmp_path: Path,
) -> None:
    g = torch.Generator().manual_seed(0)
    n = 1017
    edges = (
        torch.randint(0, 200, (n,), generator=g),
        torch.randint(0, 200, (n,), generator=g),
        torch.zeros(n, dtype=torch.int64),
        None,
    )
    it = Iteration(index=0, epoch=0, edge_path_idx=0, chunk=0)
    store = _store()
    prepared = []
    for r in range(2):
        share = ReplicaShare(_Job(tmp_path), r, 2, store=store)  # type: ignore[arg-type]
        prepared.append(share.prepare(it, (0, 0), _Pool(), edges, seed=5))  # type: ignore[arg-type]
    (order0, plan0, claims0), (order1, plan1, claims1) = prepared
    assert torch.equal(order0, order1) and (plan0 == plan1).all()  # every share, everywhere
    assert sorted(order0.tolist()) == list(range(n))
    trained = [order0[plan0[k, 0] : plan0[k, 1]] for k in claims0]  # replica 0 alone
    assert list(claims1) == []  # replica 0 took everything
    assert sorted(torch.cat(trained).tolist()) == list(range(n))
    # one worker only: several workers keep the fixed split (their own queue steals)
    share = ReplicaShare(_Job(tmp_path, workers=2), 0, 2, store=store)  # type: ignore[arg-type]
    assert share.store is None
    off = _Job(tmp_path, communication={"replica_stealing": False})
    assert ReplicaShare(off, 0, 2, store=store).store is None  # type: ignore[arg-type]
