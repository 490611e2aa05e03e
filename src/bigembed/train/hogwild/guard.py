"""Worker processes: dying with the trainer whatever happens. Standard library only.

**Lifetime.** A worker must not outlive a trainer killed with SIGKILL: each holds hundreds of
MB and would wait for tasks forever. A worker process starts in :func:`worker_entry`, which
arms the guard before anything heavy is imported or unpickled; so this module imports the
standard library only, nothing of bigembed, torch or numpy (an import-linter contract in
pyproject.toml), and learns the worker's main function as a ``"module:function"`` string that it
resolves only once the guard is armed:

1. the trainer's pid is opened as a *pidfd* (Linux 5.3+): if the trainer is already gone the
   worker exits at once, else a daemon thread sleeps in ``poll()`` on it and ends the process
   the moment the trainer exits (a killed trainer is noticed within milliseconds, even though
   a forked worker's parent is the forkserver, not the trainer);
2. a spawned worker (parent = trainer) also asks the kernel for ``SIGKILL`` on its parent's
   death (``prctl(PR_SET_PDEATHSIG)``);
3. without pidfds, a daemon thread polls the trainer's pid every second.

**Start.** Workers are forked from a *forkserver* that imported the worker code once
(:data:`PRELOAD`; the context is :func:`bigembed.train.hogwild.pool.worker_context`), so a
program that trains several times (the Python API, ``bigembed tune``, a test suite) pays for
importing torch once, not per worker and run. The forkserver is a fresh single-threaded process
(no OpenMP pool to break by forking); where there is none (Windows) workers are spawned. The
environment a worker sees is the trainer's at the time the pool starts
(:func:`adopt_environment`), as with ``spawn``. The forkserver exits when the trainer does (it
reads EOF from the trainer), and ignores SIGINT and SIGTERM like the workers: the trainer stops
the workers, and a forkserver killed by a signal sent to the whole process group would make
every worker look dead to the trainer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import select
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
POLL_SECONDS = 1.0
#: The module the forkserver imports before it forks any worker.
PRELOAD = "bigembed.train.hogwild.preload"


def adopt_environment(environ: dict[str, str]) -> None:
    """Make this worker's environment the trainer's (a forkserver started earlier in the same
    program holds the environment of that moment; settings read when used, such as
    ``BIGEMBED_CACHE_DIR``, must follow the trainer's current one)."""
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)


def _prctl(option: int, arg: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _exit_when_readable(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while not poller.poll():
        pass
    os._exit(1)


def _poll_pid(pid: int, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass  # alive (or reused by a process of another user: cannot tell)


def guard_parent(parent_pid: int, interval: float = POLL_SECONDS) -> None:
    """Make this process end when the trainer ``parent_pid`` dies; exits now if it has."""
    if os.getppid() == parent_pid:  # spawned (not forked by the forkserver)
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    pidfd: int | None = None
    opener = getattr(os, "pidfd_open", None)
    if opener is not None:
        try:
            pidfd = opener(parent_pid)
        except ProcessLookupError:
            os._exit(1)
        except OSError:  # no pidfd support in this kernel
            pidfd = None
    if pidfd is not None:
        if select.select([pidfd], [], [], 0)[0]:  # exited, not yet reaped
            os._exit(1)
        target: Any = _exit_when_readable
        args: tuple = (pidfd,)
    else:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass
        target, args = _poll_pid, (parent_pid, interval)
    threading.Thread(target=target, args=args, name="trainer-watchdog", daemon=True).start()


def name_process(name: str) -> None:
    """Set the name ``ps``/``top`` show (Linux; at most 15 bytes are kept)."""
    _prctl(PR_SET_NAME, name.encode()[:15])


def worker_entry(
    parent_pid: int, rank: int, main: str, tasks: Any, results: Any, *shared: Any
) -> None:
    """Target of a Hogwild worker process: guard first, then the (heavy) worker loop ``main``
    (``"module:function"``, imported only now), called as ``main(rank, tasks, results,
    *shared)``.

    The worker's setup (model, shared tables) arrives as the first message on ``tasks`` rather
    than as a process argument, so that nothing heavy is unpickled before the guard is in place.
    ``shared``: small synchronisation objects that can only travel as process arguments (the
    work-stealing counter, a lock).
    """
    guard_parent(parent_pid)
    name_process(f"bigembed-hw{rank}")
    # The parent handles Ctrl-C and SIGTERM (sent to the whole process group by a terminal,
    # `kill -- -PGID` or `systemctl stop`) and stops us; dying here first would turn a clean
    # interruption into a "worker died" error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    module, _, function = main.partition(":")
    getattr(importlib.import_module(module), function)(rank, tasks, results, *shared)
