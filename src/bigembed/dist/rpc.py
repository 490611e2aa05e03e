"""Small request/reply messages over the rendezvous store (the lock and partition servers' calls).

A channel is a numbered queue in the store: a client takes the next number ``n`` with an atomic
``add``, writes ``CHANNEL/req/n`` (JSON) and waits for ``CHANNEL/rep/n``; the server takes the
requests in number order, waiting on each key with a short timeout so it can notice a stop
request. Store waits are push-based in TCPStore, so a call costs a few round trips and no
polling delay; every wait has a timeout; nothing here uses gloo, whose timeouts tear down the
connection (gloo is kept for the bulk data that both sides are known to be ready for).

Messages are JSON, not pickles: the peers are trusted, but JSON keeps the protocol readable in
the store and in logs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from bigembed.dist.store import is_timeout
from bigembed.errors import PeerError

logger = logging.getLogger(__name__)

Message = dict[str, Any]


class RpcClient:
    def __init__(self, store: dist.Store, channel: str, timeout: float, peer: str) -> None:
        self.store = store
        self.channel = channel
        self.timeout = timeout
        self.peer = peer  # human name for messages

    def send(self, msg: Message) -> int:
        """Post a request; returns its number (the reply key's suffix and a unique tag)."""
        try:
            n = int(self.store.add(f"{self.channel}/seq", 1))
            self.store.set(f"{self.channel}/req/{n}", json.dumps({**msg, "seq": n}))
        except Exception as exc:
            raise PeerError(f"cannot send a request to {self.peer}: {exc}") from None
        return n

    def receive(self, n: int, suffix: str = "rep", timeout: float | None = None) -> Message:
        key = f"{self.channel}/{suffix}/{n}"
        limit = self.timeout if timeout is None else timeout
        try:
            self.store.wait([key], timedelta(seconds=limit))
            reply = json.loads(self.store.get(key))
            self.store.delete_key(key)
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
    ) -> None:
        self.store = store
        self.channel = channel
        self.handler = handler
        self.on_error = on_error
        self.poll = poll
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

    def reply(self, n: int, msg: Message, suffix: str = "rep") -> None:
        self.store.set(f"{self.channel}/{suffix}/{n}", json.dumps(msg))

    def _run(self) -> None:
        n = 1
        while not self._stop.is_set():
            key = f"{self.channel}/req/{n}"
            try:
                self.store.wait([key], timedelta(seconds=self.poll))
            except Exception as exc:
                if is_timeout(exc):
                    continue
                if not self._stop.is_set():
                    self.on_error(f"{self.channel} server lost the rendezvous store: {exc}")
                return
            try:
                request = json.loads(self.store.get(key))
                self.store.delete_key(key)
                try:
                    answer = self.handler(request)
                except PeerError:
                    raise
                except Exception as exc:  # a protocol error: tell the caller
                    logger.exception("%s: request %s failed", self.channel, request)
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                if answer is not None:
                    self.reply(n, answer)
            except Exception as exc:
                if not self._stop.is_set():
                    self.on_error(f"{self.channel} server failed: {exc}")
                return
            n += 1
