"""Background threads that write partitions back and read the next ones ahead of time.

The store runs two of these queues, one for write-backs and one for reads, so that reading the
next bucket's partition never queues behind an unrelated write. Each runs its jobs one at a
time, first in first out. Ordering between them is explicit: a read job is submitted ``after``
the write-back of the same partition (never read a partition before its write-back is
complete) and, when the memory budget is short, after the write-backs that free its room.

With ``background=False`` every job runs in the caller's thread at once (the synchronous
behaviour of stores built without a budget, or with ``partition_prefetch: false``).

Every wait for a job may carry a deadline (distributed mode: a transfer whose calls are each
bounded by ``distributed_timeout`` may still hang in something unbounded, e.g. a dead shared
disk): :class:`TransferTimeout` then names what was waited for.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any


class TransferTimeout(TimeoutError):
    """A background job did not finish within the deadline its waiter gave."""


class Job:
    """A queued call; :meth:`result` waits for it and re-raises its error. It starts only after
    the jobs it is ``after`` have finished (a read after the write-back it depends on)."""

    def __init__(self, fn: Callable[[], Any], after: Sequence[Job] = ()) -> None:
        self.fn: Callable[[], Any] | None = fn
        self.after: list[Job] = list(after)
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        fn, self.fn = self.fn, None
        try:
            assert fn is not None
            for dep in self.after:
                dep.result()
            self.after = []
            self._value = fn()
        except BaseException as exc:
            self._error = exc
        finally:
            # Drop the callable (a write-back's closure holds the evicted table) BEFORE telling
            # anyone the job is done: a read waiting for this write-back allocates its table as
            # soon as it wakes, and if this thread were preempted before its frame let go of
            # the closure, both tables would be alive at once -- one table over the memory
            # budget, enough for a tight cgroup limit to OOM-kill the run in that allocation.
            fn = None
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def failed(self) -> bool:
        return self._done.is_set() and self._error is not None

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise TransferTimeout(f"not finished within {timeout:g}s")
        if self._error is not None:
            raise self._error
        return self._value

    def take(self, timeout: float | None = None) -> Any:
        """:meth:`result`, after which the job no longer holds it (a table's memory)."""
        value = self.result(timeout)
        self._value = None
        return value


class PartitionIO:
    """Runs jobs in a daemon thread (or inline); :meth:`drain` waits for all of them."""

    def __init__(self, background: bool) -> None:
        self.background = background
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._jobs: list[Job] = []

    def submit(self, fn: Callable[[], Any], after: Sequence[Job] = ()) -> Job:
        job = Job(fn, after)
        if not self.background:
            job.run()
            return job
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="partition-io", daemon=True)
            self._thread.start()
        self._jobs = [j for j in self._jobs if not j.done() or j.failed()]
        self._jobs.append(job)
        self._queue.put(job)
        return job

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.run()
            del job

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every queued job (each within ``timeout``); re-raises the first error."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.result(timeout)

    def check(self) -> None:
        """Re-raise the error of a job that already failed (without waiting for any)."""
        for job in self._jobs:
            if job.failed():
                self._jobs.remove(job)
                job.result()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
