"""Small request/reply messages over the rendezvous store (the lock and partition servers' calls).

A channel is a numbered queue in the store: a client takes the next number ``n`` with an atomic
``add``, writes ``CHANNEL/req/n`` (JSON) and waits for ``CHANNEL/rep/n``; the server takes the
requests in number order, waiting on each key with a short timeout so it can notice a stop
request. Store waits are push-based in TCPStore, so a call costs a few round trips and no
polling delay; every wait has a timeout; nothing here uses gloo, whose timeouts tear down the
connection (gloo is kept for the bulk data that both sides are known to be ready for).

Messages are JSON, never pickles (the store is reachable by anybody who can reach its port).
With a shared secret (:mod:`bigembed.distributed.auth`) every request and reply is sealed with the
run's session key and bound to its store key: the server drops (and logs) a request without a
valid MAC without answering it, and a client stops the run on a forged reply. A request number
taken but never written (a crashed client, or a stranger) is skipped after ``GAP_S`` seconds so
it cannot block the queue.

Every request is validated before it acts (with or without a secret): its size is bounded
(``MAX_MESSAGE_BYTES``), and the handlers check its fields with :func:`field` (a known op, a
rank that is a member of the run, integers in range, lists of bounded length); a request that
fails is answered with an error and logged as a warning, and changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from bigembed.distributed.auth import BadMac, Session, seal, unseal
from bigembed.distributed.store import is_timeout, store_set
from bigembed.errors import PeerError

logger = logging.getLogger(__name__)

Message = dict[str, Any]
GAP_S = 5.0
MAX_MESSAGE_BYTES = 1 << 20


class BadRequest(ValueError):
    """A malformed or out-of-range request (refused without a traceback in the log)."""


def field(
    req: Message,
    name: str,
    kind: type,
    *,
    low: int | None = None,
    high: int | None = None,
    choices: tuple[str, ...] | None = None,
    max_len: int | None = None,
) -> Any:
    """``req[name]``, checked: of type ``kind``; an int within [low, high); a str among
    ``choices``; a list of at most ``max_len`` items. Raises BadRequest naming the field."""
    value: Any = req.get(name)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if ok and kind is int:
        ok = (low is None or value >= low) and (high is None or value < high)
    if ok and choices is not None:
        ok = value in choices
    if ok and max_len is not None:
        ok = len(value) <= max_len
    if not ok:
        raise BadRequest(f"bad field {name!r}: {str(value)[:80]!r}")
    return value


class RpcClient:
    def __init__(
        self,
        store: dist.Store,
        channel: str,
        timeout: float,
        peer: str,
        session: Session | None = None,
    ) -> None:
        self.store = store
        self.channel = channel
        self.timeout = timeout
        self.peer = peer  # human name for messages
        self.session = session

    def send(self, msg: Message) -> int:
        """Post a request; returns its number (the reply key's suffix and a unique tag)."""
        try:
            n = int(self.store.add(f"{self.channel}/seq", 1))
            key = f"{self.channel}/req/{n}"
            store_set(self.store, key, seal(self.session, key, json.dumps({**msg, "seq": n})))
        except Exception as exc:
            raise PeerError(f"cannot send a request to {self.peer}: {exc}") from None
        return n

    def receive(self, n: int, suffix: str = "rep", timeout: float | None = None) -> Message:
        key = f"{self.channel}/{suffix}/{n}"
        limit = self.timeout if timeout is None else timeout
        try:
            self.store.wait([key], timedelta(seconds=limit))
            raw = self.store.get(key)
            self.store.delete_key(key)
            reply = json.loads(unseal(self.session, key, raw))
        except BadMac as exc:
            raise PeerError(
                f"a reply from {self.peer} is not signed with the run's secret ({exc}): "
                "somebody else writes to the rendezvous store"
            ) from None
        except Exception as exc:
            if is_timeout(exc):
                raise PeerError(f"{self.peer} did not answer within {limit:g}s") from None
            raise PeerError(f"lost contact with {self.peer}: {exc}") from None
        if "error" in reply:
            raise PeerError(f"{self.peer} refused a request: {reply['error']}")
        return reply

    def call(self, msg: Message) -> Message:
        return self.receive(self.send(msg))


class RpcServer:
    """Serves one channel on its own thread and store connection."""

    def __init__(
        self,
        store: dist.Store,
        channel: str,
        handler: Callable[[Message], Message | None],
        on_error: Callable[[str], None],
        poll: float = 1.0,
        name: str = "bigembed-rpc",
        session: Session | None = None,
    ) -> None:
        self.store = store
        self.channel = channel
        self.handler = handler
        self.on_error = on_error
        self.poll = poll
        self.session = session
        self.dropped = 0  # requests refused for a missing or invalid MAC
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.poll * 3 + 1)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def encode(self, n: int, msg: Message, suffix: str = "rep") -> tuple[str, str | bytes]:
        """(store key, value) of the answer ``msg`` to request ``n`` (sealed with a secret)."""
        key = f"{self.channel}/{suffix}/{n}"
        return key, seal(self.session, key, json.dumps(msg))

    def reply(self, n: int, msg: Message, suffix: str = "rep") -> None:
        store_set(self.store, *self.encode(n, msg, suffix))

    def _skippable(self, n: int, since: float) -> bool:
        """Request ``n`` was taken ``GAP_S`` ago but never written, and later ones exist."""
        if time.monotonic() - since < GAP_S:
            return False
        return int(self.store.add(f"{self.channel}/seq", 0)) > n

    def _run(self) -> None:
        n = 1
        since = time.monotonic()
        while not self._stop.is_set():
            key = f"{self.channel}/req/{n}"
            try:
                self.store.wait([key], timedelta(seconds=self.poll))
            except Exception as exc:
                if is_timeout(exc):
                    try:
                        if self._skippable(n, since):
                            logger.warning(
                                "%s: request %d was never written; skipped", self.channel, n
                            )
                            n, since = n + 1, time.monotonic()
                    except Exception:  # the wait above reports a lost store
                        pass
                    continue
                if not self._stop.is_set():
                    self.on_error(f"{self.channel} server lost the rendezvous store: {exc}")
                return
            try:
                raw = self.store.get(key)
                self.store.delete_key(key)
                try:
                    if len(raw) > MAX_MESSAGE_BYTES:
                        raise BadMac(f"{key}: {len(raw)} bytes, more than {MAX_MESSAGE_BYTES}")
                    request = json.loads(unseal(self.session, key, raw))
                    if not isinstance(request, dict) or request.get("seq") != n:
                        raise BadMac(f"{key}: malformed request")
                except (BadMac, ValueError) as exc:
                    self.dropped += 1
                    logger.warning(
                        "%s: dropped a request without a valid MAC, or malformed (%s)",
                        self.channel,
                        exc,
                    )
                    n, since = n + 1, time.monotonic()
                    continue
                try:
                    answer = self.handler(request)
                except PeerError:
                    raise
                except BadRequest as exc:  # a stranger, or a bug: refuse, change nothing
                    logger.warning("%s: refused request %d: %s", self.channel, n, exc)
                    answer = {"error": str(exc)}
                except Exception as exc:  # a protocol error: tell the caller
                    logger.exception("%s: request %s failed", self.channel, request)
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                if answer is not None:
                    self.reply(n, answer)
            except Exception as exc:
                if not self._stop.is_set():
                    self.on_error(f"{self.channel} server failed: {exc}")
                return
            n, since = n + 1, time.monotonic()
