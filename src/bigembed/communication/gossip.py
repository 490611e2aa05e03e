"""Pairing trainers that are ready to gossip, through the rendezvous store, without waiting.

``async_decentralized`` averages with whichever peer is ready when a trainer is: nobody waits
for a particular peer, so a slow or busy trainer holds nobody up. :class:`PairingBoard` forms
the pairs with three atomic store operations, no lock and no round number shared by all:

* a ready trainer takes a ticket (``add`` on one counter). Tickets come in pairs (1, 2),
  (3, 4), ...: the holder of an odd ticket *opens* slot n, the holder of n + 1 *joins* it;
* the opener writes its rank in the slot and waits up to ``patience`` seconds for a joiner;
* whoever of the two first increments the slot's claim counter decides it: the joiner (it is
  paired, writes its rank and both exchange) or the opener giving up (the slot is void; a
  joiner that comes later sees the claim taken and leaves at once).

A pair is therefore agreed by both trainers or by neither, each trainer is in at most one pair
at a time (a thread holds one ticket at a time), and nobody waits more than ``patience`` for a
partner: two trainers never wait for each other in a cycle. A trainer whose partner died
during the agreement waits for the store's timeout (``distributed_timeout``) and fails.

Keys: ``PREFIX/ticket`` and, per slot, ``PREFIX/N/rank``, ``PREFIX/N/claim``,
``PREFIX/N/joiner``; the last trainer to touch a slot deletes its keys.
"""

from __future__ import annotations

import time

import torch.distributed as dist

_POLL_S = 0.002


class PairingBoard:
    """One trainer's side of the pairing (one instance per trainer and strategy instance;
    ``prefix`` must name the same instance on every trainer)."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, patience: float) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.patience = patience
        self.attempts = 0
        self.paired = 0

    def _key(self, slot: int, what: str) -> str:
        return f"{self.prefix}/{slot}/{what}"

    def try_pair(self) -> int | None:
        """The rank of a trainer that is ready now and agreed to pair with this one, or None
        (nobody came within ``patience``)."""
        self.attempts += 1
        ticket = int(self.store.add(f"{self.prefix}/ticket", 1))
        peer = self._open(ticket) if ticket % 2 else self._join(ticket - 1)
        if peer is not None:
            self.paired += 1
        return peer

    def _open(self, slot: int) -> int | None:
        store = self.store
        store.set(self._key(slot, "rank"), str(self.rank))
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            if store.check([self._key(slot, "joiner")]):
                return self._paired(slot)
            time.sleep(_POLL_S)
        if int(store.add(self._key(slot, "claim"), 1)) == 1:
            return None  # void: a joiner coming later finds the claim taken (and cleans up)
        return self._paired(slot)  # a joiner claimed it first: it is writing its rank

    def _paired(self, slot: int) -> int:
        peer = int(self.store.get(self._key(slot, "joiner")))
        for what in ("rank", "claim", "joiner"):  # the joiner has read all it needs
            self.store.delete_key(self._key(slot, what))
        return peer

    def _join(self, slot: int) -> int | None:
        store = self.store
        if int(store.add(self._key(slot, "claim"), 1)) != 1:
            for what in ("rank", "claim"):  # the opener gave up and left: nobody reads these
                store.delete_key(self._key(slot, what))
            return None
        peer = int(store.get(self._key(slot, "rank")))  # set by the opener before it waits
        store.set(self._key(slot, "joiner"), str(self.rank))
        return peer
