"""SIGTERM and SIGINT on a distributed rank: end the whole run, saying why, like any failure.

A Python signal handler runs only when the main thread gets back to the interpreter, and a
rank's main thread may sit in a gloo or store call for a long time. So the handlers do nothing
themselves; the C-level handler writes the signal number to a wakeup socket
(:func:`signal.set_wakeup_fd`), and a helper thread reading it stops the run at once: it tells
the other ranks (the ``abort`` key names this rank and the signal) and exits non-zero with one
line, the same path as any error of this rank.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_stop_signals(on_stop: Callable[[str], None]) -> Callable[[], None]:
    """Call ``on_stop("interrupted by SIGTERM")`` (or SIGINT) when one arrives.

    Only the main thread can set handlers: from another thread (a rank run inside a test or
    an embedding program) nothing is installed. Returns a function that restores the previous
    handlers (when the rank finished normally).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for s in STOP_SIGNALS:
        signal.signal(s, _ignore)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                data = reader.recv(1)
            except OSError:
                return
            if not data or done.is_set():
                return
            if data[0] in {int(s) for s in STOP_SIGNALS}:
                on_stop(f"interrupted by {signal.Signals(data[0]).name}")
                return

    threading.Thread(target=watch, name="bigembed-signals", daemon=True).start()

    def uninstall() -> None:
        done.set()
        signal.set_wakeup_fd(old_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        with contextlib.suppress(OSError):
            writer.send(b"\0")  # wake the reader so it sees `done`
        writer.close()

    return uninstall


def _ignore(signum: int, frame: object) -> None:
    """The Python-level handler: the helper thread acts on the wakeup byte instead."""
