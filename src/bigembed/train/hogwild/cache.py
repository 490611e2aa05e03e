"""Objects sent to the Hogwild workers once, then named by a token.

Sending a shared-memory tensor to a worker process passes its file descriptor through
multiprocessing's resource sharer: one socket connection with an HMAC handshake per storage,
which costs a large share of the workers' time when buckets are short if repeated for every
bucket (two tensors per table, up to four tables, plus the edges). Consecutive buckets mostly
use the same tables and the same edge buffers, so the pool sends each object once with a token
(:class:`Handle` with a value); later tasks carry the token alone and the worker keeps the
object in its :class:`WorkerCache` until it is told to drop it (:class:`Drop`).

Dropping is a memory-budget matter: a worker still mapping an evicted table keeps its shared
memory alive. So the partition store, when it takes a table out of the resident set, asks the
pool to :meth:`~bigembed.train.hogwild.pool.HogwildPool.forget` it (a :class:`Drop` with a sequence
number goes to every worker before any later task) and, once the table is written back, waits
until every worker has acknowledged that drop before the table counts as freed. An object the
trainer lets go of otherwise (an edge buffer replaced by a larger one) is dropped lazily, with
the next message (:meth:`SentObjects.lazy_drops`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Handle(Generic[T]):
    """An object for the workers: ``value`` the first time, ``None`` once they hold it."""

    token: int
    value: T | None


@dataclass(frozen=True)
class Drop:
    """Forget these tokens; ``seq`` > 0: acknowledge (see :class:`SentObjects`)."""

    seq: int
    tokens: tuple[int, ...]


class SentObjects:
    """The trainer's side: which objects every worker holds, by identity.

    An entry lives as long as its object (a weak reference): when the trainer drops the object
    without :meth:`forget`, its token is queued for a lazy drop. Thread-safe (the partition
    store forgets tables from the training thread, their finalizers may run anywhere).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: dict[int, tuple[weakref.finalize[Any, Any], int]] = {}
        self._next = 0
        self._lazy: list[int] = []

    def handle(self, obj: T) -> Handle[T]:
        """The handle to send for ``obj``: its token alone if the workers already hold it."""
        with self._lock:
            entry = self._entries.get(id(obj))
            if entry is not None:
                alive = entry[0].peek()
                if alive is not None and alive[0] is obj:
                    return Handle(entry[1], None)
            self._next += 1
            token = self._next
            self._entries[id(obj)] = (weakref.finalize(obj, self._gone, id(obj), token), token)
            return Handle(token, obj)

    def forget(self, obj: object) -> int | None:
        """Stop tracking ``obj``; its token if the workers hold it (to drop), else None."""
        with self._lock:
            entry = self._entries.get(id(obj))
            if entry is None:
                return None
            alive = entry[0].peek()
            if alive is None or alive[0] is not obj:
                return None
            del self._entries[id(obj)]
            entry[0].detach()
            return entry[1]

    def _gone(self, key: int, token: int) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[1] == token:
                del self._entries[key]
            self._lazy.append(token)

    def lazy_drops(self) -> tuple[int, ...]:
        """Tokens of objects the trainer dropped since the last call (for the workers to drop)."""
        with self._lock:
            out, self._lazy = tuple(self._lazy), []
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class WorkerCache:
    """The worker's side: token -> object, filled by handles with values, emptied by drops."""

    def __init__(self) -> None:
        self._objects: dict[int, Any] = {}

    def resolve(self, handle: Handle[T]) -> T:
        if handle.value is not None:
            self._objects[handle.token] = handle.value
        obj: T = self._objects[handle.token]
        return obj

    def drop(self, tokens: tuple[int, ...]) -> None:
        for token in tokens:
            self._objects.pop(token, None)

    def __len__(self) -> int:
        return len(self._objects)
