"""Python objects handed to Arrow readers, and waiting until Arrow lets go of them.

Arrow's streaming CSV reader reads ahead on Arrow's own I/O threads, and those threads keep
Python objects: the file object they read, every block it returned (a Python buffer), the
invalid-row handler, and any Python exception a read raised. When we drop a reader early (a
parse error, an unknown name, a probe of the first line), read-ahead tasks may still hold
them; the last task to finish frees them, which needs the GIL. If that happens while the
interpreter is shutting down (the CLI reports the error and exits at once), Python ends that
thread with ``pthread_exit`` inside C++ code that cannot unwind, and the process aborts:
``terminate called without an active exception``, exit status 134 instead of our one-line
error and status 2 (apache/arrow#33975 is the same race).

So a text reader only gets Python objects made here (:class:`ArrowObjects`), which only Arrow
references: blocks are tracked buffers, read errors are kept here (the reader sees the end of
the input; the caller raises the error) instead of being raised into Arrow, and whoever drops
the reader stops the file and waits, bounded, until Arrow has freed every one of them.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

RELEASE_TIMEOUT = 10.0  # seconds; the read-ahead of a dropped reader normally ends in microseconds


class _Block(bytearray):
    """A block read for Arrow (a subclass, so it can be watched with a weak reference)."""


class _File(io.RawIOBase):
    """A readable stream over ``source`` (anything with ``readinto``) for ``pa.PythonFile``."""

    def __init__(self, source: Any, owner: ArrowObjects) -> None:
        super().__init__()
        self._source = source
        self._owner = owner

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes | bytearray:
        if size is None or size < 0:
            return self.readall()
        return self._owner._read(self._source, size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


class _Callback:
    """A callable forwarding to ``fn``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)


class ArrowObjects:
    """The Python objects handed to one Arrow reader, to know when Arrow has freed them all.

    Pass :meth:`file` and :meth:`callback` results to Arrow without keeping references to them.
    When done with the reader (or after it failed): :meth:`stop`, close the source, drop the
    reader, then :meth:`wait_released`. :attr:`error` holds the first exception a read raised
    (Arrow saw the end of the input instead): raise it in place of what the reader reported.
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._events: list[threading.Event] = []
        self._lock = threading.Lock()  # held while reading: stop() waits for a read in flight
        self._stopped = False
        self._blocks = 0
        self._blocks_freed = threading.Condition()

    def _watch(self, obj: Any) -> Any:
        event = threading.Event()
        weakref.finalize(obj, event.set)
        self._events.append(event)
        return obj

    def file(self, source: Any) -> io.RawIOBase:
        """A file object reading ``source``, for ``pa.PythonFile``."""
        return self._watch(_File(source, self))

    def callback(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A callable forwarding to ``fn`` (e.g. an ``invalid_row_handler``)."""
        return self._watch(_Callback(fn))

    def stop(self) -> None:
        """Every further read returns end-of-input; after this the source may be closed."""
        with self._lock:
            self._stopped = True

    def _read(self, source: Any, size: int) -> bytes | bytearray:
        with self._lock:
            if self._stopped or self.error is not None:
                return b""
            block = _Block(size)
            try:
                with memoryview(block) as view:
                    got = source.readinto(view)
            except Exception as exc:  # kept for the caller: an exception in Arrow outlives us
                self.error = exc
                return b""
            del block[got or 0 :]
            with self._blocks_freed:
                self._blocks += 1
            weakref.finalize(block, self._block_freed)
            return block

    def _block_freed(self) -> None:
        with self._blocks_freed:
            self._blocks -= 1
            self._blocks_freed.notify_all()

    def released(self) -> bool:
        return all(e.is_set() for e in self._events) and self._blocks == 0

    def wait_released(self, timeout: float = RELEASE_TIMEOUT) -> None:
        """Wait until Arrow has freed every object (bounded: a stuck reader is only logged)."""
        deadline = time.monotonic() + timeout
        for event in self._events:  # the file first: once it is gone, no new block appears
            if not event.wait(max(0.0, deadline - time.monotonic())):
                logger.debug("an Arrow reader still holds its input after %.0f s", timeout)
                return
        with self._blocks_freed:
            if not self._blocks_freed.wait_for(
                lambda: self._blocks == 0, max(0.0, deadline - time.monotonic())
            ):
                logger.debug("Arrow still holds %d block(s) after %.0f s", self._blocks, timeout)
