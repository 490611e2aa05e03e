"""Fault detection: heartbeats through the store, a watchdog thread, and the abort path.

PBG blocks in gloo with a 365-day timeout when a peer dies. Here every rank bumps a counter
``hb/RANK`` in the rendezvous store a few times per ``distributed_timeout`` and watches everybody
else's; a counter that has not moved for ``distributed_timeout`` seconds (measured on this
machine's monotonic clock, so clocks need not agree) marks its rank as gone. The first rank to
notice publishes an ``abort`` key naming the peer, so the others stop at once with the same
message, and every rank exits non-zero. A rank that loses the store itself knows rank 0 (its
host) is gone. Ranks that finished cleanly leave a ``bye/RANK`` key and are not mourned.

Other threads that hit a communication error call :meth:`Watchdog.fail`: it waits a little for
the heartbeats to name the dead peer (a broken gloo pair only says "connection closed"), then
stops the process the same way.

The lifeline: a store call on a dead connection (network partition, frozen rank 0) never
returns, so a watchdog that only made store calls would block with everybody else. A second
thread, the deadman, makes no store call at all: it ends the rank when no heartbeat has
completed for ``distributed_timeout`` seconds ("cannot reach the rendezvous store"). It also
notices when this process itself was suspended (SIGSTOP) for longer than that: the others have
given up on it by then. The lifeline runs from the first connection on, so a rank also stops if
rank 0 freezes while it joins; the peers are watched once everybody has joined
(:meth:`Watchdog.watch_peers`). Every store call on the way out (publishing ``abort``,
``bye``) is bounded too (:func:`~bigembed.distributed.store.best_effort`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from bigembed.distributed.auth import BadMac, Session, seal, unseal
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.store import StoreAddress, best_effort, is_timeout, store_set
from bigembed.errors import PeerError

logger = logging.getLogger(__name__)

EXIT_CODE = PeerError.exit_code


def heartbeat_period(timeout: float) -> float:
    return min(1.0, max(0.05, timeout / 10))


def exit_now(message: str, command: str = "train") -> None:
    """Print the one-line error the CLI would print and leave at once.

    ``os._exit``, not an exception: other threads may sit in gloo calls that only time out
    later, and a normal interpreter exit would wait for them.
    """
    print(f"bigembed {command}: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_CODE)


class Watchdog:
    """Heartbeats for this rank and a watch on every other rank of the world."""

    def __init__(
        self,
        address: StoreAddress,
        rank: int,
        layout: RankLayout,
        timeout: float,
        *,
        on_fatal: Callable[[str], None] = exit_now,
    ) -> None:
        self.address = address
        self.rank = rank
        self.layout = layout
        self.timeout = timeout
        self.period = heartbeat_period(timeout)
        self.on_fatal = on_fatal
        self.store = address.namespaced(address.client(timeout))
        self.peers = [r for r in range(layout.world_size) if r != rank]
        self.failure: str | None = None
        self.gone: set[int] = set()  # peers whose heartbeat stopped: nobody to wait for
        self.session: Session | None = None  # set once joined with a secret: signs ``abort``
        self.last_ok = time.monotonic()  # when a heartbeat last completed
        self.store_lost = False  # the deadman fired: no store call can complete now
        self._watching = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="bigembed-watchdog", daemon=True)
        self._deadman = threading.Thread(
            target=self._deadman_run, name="bigembed-deadman", daemon=True
        )

    # ------------------------------------------------------------------ lifecycle
    def beat(self) -> None:
        self.store.add(f"hb/{self.rank}", 1)
        self.last_ok = time.monotonic()

    def start(self) -> None:
        """Start the lifeline (heartbeats and the deadman); see :meth:`watch_peers`."""
        self.last_ok = time.monotonic()
        self._thread.start()
        self._deadman.start()

    def watch_peers(self) -> None:
        """Everybody has joined: from now on, watch their heartbeats and the ``abort`` key."""
        self._watching.set()

    def stop(self, clean: bool = True) -> None:
        """Stop watching; ``clean`` tells the others this rank finished (no alarm)."""
        if clean:  # the store host may be gone at the very end
            best_effort(lambda: self.store.set(f"bye/{self.rank}", "1"), min(self.timeout, 3.0))
        self._stop.set()
        for thread in (self._thread, self._deadman):
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout=5 * self.period + 1)

    # ------------------------------------------------------------------ the lifeline
    def _deadman_run(self) -> None:
        """No store call here: this thread must run when every store call hangs."""
        while self._sleep():
            now = time.monotonic()
            silent = now - self.last_ok
            if silent <= self.timeout:
                continue
            if self.address.attempt:
                why = "the launcher's agent, which hosts it, is frozen or unreachable"
            elif self.rank == 0 and self.address.kind == "tcp":
                why = "the rendezvous store this rank hosts does not answer"
            else:
                why = (
                    f"{self.layout.role(0)} is frozen or unreachable (network down or partitioned?)"
                )
            self.store_lost = True  # publishing or leaving would only wait for nothing
            self._die(
                f"cannot reach the rendezvous store at {self.address.method} for {silent:.0f}s "
                f"(distributed_timeout is {self.timeout:g}s): {why}",
                publish=False,
            )
            return

    def _sleep(self) -> bool:
        """Wait one period; False when stopped, or when the thread slept longer than the
        timeout: this process was stopped (SIGSTOP, a frozen VM) and the run is over."""
        before = time.monotonic()
        if self._stop.wait(self.period):
            return False
        gap = time.monotonic() - before
        if gap <= self.timeout:
            return True
        self._die(
            f"{self.layout.role(self.rank)} was suspended for {gap:.0f}s, longer than "
            f"distributed_timeout ({self.timeout:g}s): the other ranks have given up on it"
        )
        return False

    # ------------------------------------------------------------------ the watch
    def _run(self) -> None:
        last: dict[int, tuple[bytes, float]] = {}
        keys = [f"hb/{p}" for p in self.peers]
        store_errors = 0
        while self._sleep():
            try:
                self.beat()
                if not self._watching.is_set():
                    continue
                if self.store.check(["abort"]):
                    self._die(self.read_abort(self.store.get("abort")), publish=False)
                    return
                values = self.store.multi_get(keys) if keys else []
                store_errors = 0
            except Exception as exc:  # any store failure is a verdict or a retry
                if self._stop.is_set():
                    return
                store_errors += 1
                if is_timeout(exc) and store_errors * self.period < self.timeout:
                    continue
                if self.rank != 0:
                    self._die(
                        f"lost the rendezvous store at {self.address.method}: "
                        f"{self.layout.role(0)} is gone ({str(exc).strip().splitlines()[0]})"
                    )
                else:
                    self._die(f"the rendezvous store failed: {exc}")
                return
            now = time.monotonic()
            for peer, value in zip(self.peers, values, strict=True):
                seen = last.get(peer)
                if seen is None or seen[0] != value:
                    last[peer] = (value, now)
                    continue
                silent = now - seen[1]
                if silent > self.timeout:
                    try:
                        if self.store.check([f"bye/{peer}"]):
                            continue
                    except Exception:
                        pass
                    self.gone.add(peer)
                    self._die(
                        f"{self.layout.role(peer)} is gone: no heartbeat for {silent:.0f}s "
                        f"(distributed_timeout is {self.timeout:g}s)"
                    )
                    return

    def check(self) -> None:
        """Raise if the watch has already condemned the run (for loops that poll)."""
        if self.failure is not None:
            raise PeerError(self.failure)

    def _die(self, message: str, publish: bool = True) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
        if publish:  # best effort; the others have their own watch
            text = f"{message} (noticed by {self.layout.role(self.rank)})"
            self.publish_abort(text)
        self.on_fatal(message)

    def publish_abort(self, text: str) -> None:
        """Tell every rank the run is over, and why (signed with the run's secret, if any)."""
        value = seal(self.session, "abort", text)
        best_effort(lambda: store_set(self.store, "abort", value), min(self.timeout, 2.0))

    def read_abort(self, value: bytes) -> str:
        """The reason in ``abort``; with a secret, a forged one is reported as such (the run
        stops anyway: anybody who reaches the store can stop it)."""
        try:
            return unseal(self.session, "abort", value).decode(errors="replace")
        except BadMac:
            text = value.decode(errors="replace")[:200]
            return (
                "somebody else wrote an abort to the rendezvous store, not signed with the "
                f"run's secret: {text!r}"
            )

    def fail(self, message: str) -> None:
        """Stop the run after a communication error, naming the dead peer if one shows up."""
        deadline = time.monotonic() + self.timeout + 3 * self.period
        while time.monotonic() < deadline and self.failure is None and self._thread.is_alive():
            time.sleep(self.period / 2)
        if self.failure is None:
            self._die(message)
        else:
            self.on_fatal(self.failure)


def store_barrier(
    store: dist.Store, name: str, size: int, watchdog: Watchdog | None, poll: float = 1.0
) -> None:
    """Wait until ``size`` ranks have reached barrier ``name``.

    It waits as long as every peer is alive, because the slowest trainer may legitimately
    still be training a large bucket; the watchdog ends the wait if one dies. (A gloo barrier
    would time out after a fixed delay, and a timeout there closes the connections for good.)
    """
    arrived = store.add(f"barrier/{name}/count", 1)
    if arrived == size:
        store.set(f"barrier/{name}/done", "1")
    while True:
        try:
            store.wait([f"barrier/{name}/done"], timedelta(seconds=poll))
            return
        except Exception as exc:
            if not is_timeout(exc):
                raise PeerError(f"barrier {name!r}: lost the rendezvous store ({exc})") from None
        if watchdog is not None:
            watchdog.check()
