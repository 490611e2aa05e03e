"""A gate the Hogwild workers pass before every batch, so that an outside party can hold them.

Synchronous communication strategies (:mod:`bigembed.communication.strategies`) promise that a
trainer never trains more than ``sync_every`` batches on shared parameters the other trainers
have not merged yet. The workers are separate processes, so the promise is kept through shared
memory: each worker counts the batches it has finished (its own slot, so no two processes write
the same number), and before a batch waits while the trainer's total has reached the
``budget`` the strategy last granted. The strategy's round thread reads the total, runs its
round, and raises the budget. With a single worker the worker is the trainer's main thread and
the round thread runs beside it.

A gate that is never closed (asynchronous strategies only read the count) costs one
comparison per batch. Workers can overshoot the budget by at most one batch each (two may pass
the check at once); the promise is "at most ``sync_every`` batches, plus one per worker".
"""

from __future__ import annotations

import time

import torch

OPEN = 2**62  # a budget no run reaches

_POLL_S = 0.0005


class BatchGate:
    """Per-worker batch counters and a budget, in shared memory (picklable to the workers)."""

    def __init__(self, workers: int) -> None:
        self.done = torch.zeros(workers, dtype=torch.int64).share_memory_()
        self.budget = torch.full((1,), OPEN, dtype=torch.int64).share_memory_()
        #: seconds each worker has waited here (its own slot)
        self.waited = torch.zeros(workers, dtype=torch.float64).share_memory_()
        #: seconds the round thread kept the gate closed waiting for the other trainers to reach
        #: the round (written by that thread only, read by the trainer; see :meth:`peer_waited`)
        self._peer_waited = 0.0

    # ------------------------------------------------------------------ worker side
    def wait_turn(self, slot: int = 0) -> None:
        """Called by worker ``slot`` before each batch: returns once the budget allows one
        more (the time it waited is added to its ``waited`` slot)."""
        if int(self.done.sum()) < int(self.budget[0]):
            return
        started = time.perf_counter()
        while int(self.done.sum()) >= int(self.budget[0]):
            time.sleep(_POLL_S)
        self.waited[slot] += time.perf_counter() - started

    def passed(self, slot: int) -> None:
        """Called by worker ``slot`` after each batch."""
        self.done[slot] += 1

    # ------------------------------------------------------------------ controller side
    def wait_seconds(self) -> float:
        """Seconds all workers have waited at the gate so far (in this run), summed."""
        return float(self.waited.sum())

    def add_peer_wait(self, seconds: float) -> None:
        """Called by the round thread: it held the gate closed ``seconds`` waiting for the
        other trainers to reach a round that its workers' used budget started."""
        self._peer_waited += seconds

    def peer_waited(self) -> float:
        """Of :meth:`wait_seconds`, the round thread's share spent waiting for slower trainers,
        so far: what the split of the work between trainers decides (the rest is the round
        itself and the thread's look at the gate). Not summed over workers: they wait together."""
        return self._peer_waited

    def batches(self) -> int:
        """Batches finished by all workers so far (in this run)."""
        return int(self.done.sum())

    def allow(self, budget: int) -> None:
        """Let the workers run until ``budget`` batches are done in total."""
        self.budget[0] = budget

    def full(self) -> bool:
        """True when the workers have used the whole budget (the next batch would wait)."""
        return self.batches() >= int(self.budget[0])
