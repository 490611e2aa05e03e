"""Worker processes that die with their parent, even when it dies while they start up.

A spawned worker must not outlive a trainer killed with SIGKILL: each holds hundreds of MB and
would run (or wait for tasks) forever. The guard therefore runs before anything heavy is
imported or unpickled (this module uses the standard library only):

1. on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker when its parent
   dies (strictly: when the parent *thread* that started it exits, so start workers from a
   thread that lives as long as the pool, e.g. the main thread);
2. then ``os.getppid()`` is compared with the pid the parent passed in: if the parent died
   before step 1 took effect the worker has already been re-parented, and exits at once;
3. a daemon thread polls the parent every second and ends the process when it is gone (the
   fallback where there is no prctl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 1.0


def _set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int, interval: float) -> None:
    while True:
        time.sleep(interval)
        if os.getppid() != parent_pid:
            os._exit(1)


def guard_parent(parent_pid: int, interval: float = POLL_SECONDS) -> None:
    """Make this process end when ``parent_pid`` (its parent) dies; exits now if it has."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(
        target=_watch, args=(parent_pid, interval), name="parent-watchdog", daemon=True
    ).start()


def worker_entry(parent_pid: int, rank: int, tasks: Any, results: Any, *shared: Any) -> None:
    """Target of a Hogwild worker process: guard first, then the (heavy) worker loop.

    The worker's setup (model, shared tables) arrives as the first message on ``tasks`` rather
    than as a process argument, so that nothing heavy is unpickled before the guard is in place.
    ``shared``: small synchronisation objects that can only travel as process arguments (the
    work-stealing counter, a lock).
    """
    guard_parent(parent_pid)
    # The parent handles Ctrl-C and SIGTERM (sent to the whole process group by a terminal,
    # `kill -- -PGID` or `systemctl stop`) and stops us; dying here first would turn a clean
    # interruption into a "worker died" error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from bigembed.train.hogwild import worker_main

    worker_main(rank, tasks, results, *shared)
