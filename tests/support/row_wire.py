"""Trainers as threads for the row-sparse exchanges: ``exchange_rows`` over in-memory queues.

Tests monkeypatch a module's ``exchange_rows`` with :meth:`RowWire.exchange_rows` and run one
thread per trainer (:func:`in_threads`, each thread named by its rank): no process, no gloo.
:attr:`RowWire.sent` keeps every message a trainer sent, in order.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch


class RowWire:
    """``exchange_rows`` between threads named by their rank."""

    def __init__(self) -> None:
        self.boxes: dict[tuple[int, int, tuple[int, int]], queue.Queue[Any]] = defaultdict(
            queue.Queue
        )
        #: per rank: (row counts per table, payload) of every message it sent
        self.sent: dict[int, list[tuple[list[int], torch.Tensor]]] = defaultdict(list)
        self._lock = threading.Lock()

    def exchange_rows(
        self, counts: torch.Tensor, payload: torch.Tensor, peers: list[int], *args: Any
    ) -> tuple[dict[int, tuple[list[int], torch.Tensor]], int, int]:
        me, tags = int(threading.current_thread().name), args[-1]
        with self._lock:
            self.sent[me].append((counts.tolist(), payload.clone()))
        for p in peers:
            self.boxes[(me, p, tags)].put((counts.tolist(), payload.clone()))
        return {p: self.boxes[(p, me, tags)].get(timeout=10) for p in peers}, 0, 0


def in_threads(world: int, work: Callable[[int], None]) -> None:
    """``work(rank)`` on one thread per rank, each named by its rank; re-raises a failure."""
    failures: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            work(rank)
        except BaseException as exc:  # reported to the test below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(r,), name=str(r)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if failures:
        raise failures[0]
