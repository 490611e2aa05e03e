"""A read-ahead limit for pyarrow's streaming CSV reader.

The reader fetches blocks in a background thread and queues up to 32 of them when parsing
is the slower side; with 8 MiB blocks that is 256 MiB of input text held in memory. This
wrapper lets the reader get only a few blocks ahead of the batches actually consumed.
"""

from __future__ import annotations

import io
import threading
from typing import Any


class ReadAheadLimit(io.RawIOBase):
    """A readable stream over ``source`` that blocks reads beyond ``allowance`` bytes.

    The consumer calls :meth:`advance` as it uses data. A read never waits longer than
    ``timeout`` seconds, so a miscount can slow the reader down but never deadlock it.
    """

    def __init__(self, allowance: int, timeout: float = 1.0) -> None:
        super().__init__()
        self._source: Any = None
        self._read = 0
        self._allowed = allowance
        self._timeout = timeout
        self._cond = threading.Condition()
        self._stopped = False

    def attach(self, source: Any) -> None:
        """Set the stream to read from (anything with ``read(n) -> bytes``)."""
        self._source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or self._read < self._allowed, self._timeout)
            if self._stopped:
                return 0
        data = self._source.read(len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        with self._cond:
            self._read += n
        return n

    def advance(self, nbytes: int) -> None:
        """Allow ``nbytes`` more to be read (the consumer has used that much)."""
        with self._cond:
            self._allowed += nbytes
            self._cond.notify_all()

    def stop(self) -> None:
        """Make every further read return end-of-file at once (the consumer is gone)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
