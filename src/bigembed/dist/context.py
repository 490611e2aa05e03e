"""Joining and leaving a distributed run: store, handshake, config check, gloo groups, shutdown.

Start-up, on every rank (trainer or partition server):

1. connect to the rendezvous store (rank 0 hosts it for tcp://);
2. announce ``join/RANK`` (a second process claiming the same rank, or a stale file:// store,
   is refused) and wait up to ``JOIN_FACTOR x distributed_timeout`` for the whole world;
3. start the heartbeat watchdog;
4. compare configs: every rank publishes its resolved config, and any difference from rank 0's
   stops every rank with a message naming the keys (PBG silently trusts they match);
5. create the gloo process groups: the world (partition transfers) and the trainers (shared
   parameters), with ``distributed_timeout`` on every operation.

Shutdown is ordered so that rank 0, which hosts the store, leaves last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from bigembed.config import ConfigSchema, config_to_dict
from bigembed.dist.layout import RankLayout
from bigembed.dist.store import StoreAddress, choose_gloo_interface, is_timeout
from bigembed.dist.watchdog import Watchdog, exit_now, store_barrier
from bigembed.errors import ConfigError, PeerError

logger = logging.getLogger(__name__)

JOIN_FACTOR = 5  # ranks started by hand may arrive a while apart


def _config_diff(mine: dict[str, Any], theirs: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_config_diff(a, b, path + "."))
        elif a != b:
            out.append(path)
    return out


class DistContext:
    """A rank's membership in the run; use :meth:`open` and :meth:`close`."""

    def __init__(
        self,
        cfg: ConfigSchema,
        rank: int,
        *,
        command: str = "train",
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.layout = RankLayout.of(cfg)
        self.timeout = float(cfg.distributed_timeout)
        assert cfg.distributed_init_method is not None
        self.address = StoreAddress.parse(cfg.distributed_init_method)
        self.command = command
        self._exit = on_fatal or (lambda message: exit_now(message, command))
        self.raw_store: dist.Store | None = None
        self.store: dist.Store | None = None  # namespaced, for this (main) thread
        self.watchdog: Watchdog | None = None
        self.trainer_group: dist.ProcessGroup | None = None
        self.interface: str | None = None

    # ------------------------------------------------------------------ start-up
    def open(self) -> DistContext:
        try:
            return self._open()
        except dist.DistError as exc:
            raise PeerError(
                f"{self.layout.role(self.rank)}: lost contact with the other ranks while "
                f"joining ({str(exc).strip().splitlines()[0]})"
            ) from None

    def _open(self) -> DistContext:
        world = self.layout.world_size
        self.interface = choose_gloo_interface(self.address)
        join_timeout = self.timeout * JOIN_FACTOR
        self.raw_store = self.address.open(self.rank, world, join_timeout)
        store = self.store = self.address.namespaced(self.raw_store)
        with contextlib.suppress(Exception):  # not every store type has one
            store.set_timeout(timedelta(seconds=self.timeout))
        self._join(store, world, join_timeout)
        self.watchdog = Watchdog(
            self.address, self.rank, self.layout, self.timeout, on_fatal=self.on_fatal
        )
        self.watchdog.start()
        self._check_configs(store)
        self._init_groups()
        logger.info("%s joined %d-rank run at %s (gloo interface %s)", self.layout.role(self.rank),
                    world, self.address.method, self.interface or "default")
        return self

    def _join(self, store: dist.Store, world: int, timeout: float) -> None:
        claims = store.add(f"join/{self.rank}/claims", 1)
        if claims > 1:
            where = (f" or {self.address.path} is left over from an earlier run (delete it)"
                     if self.address.kind == "file" else "")
            raise PeerError(
                f"rank {self.rank} is already taken: another process joined as rank {self.rank}"
                f"{where}"
            )
        store.set(f"join/{self.rank}/host", f"{socket.gethostname()}:{os.getpid()}")
        store.add(f"hb/{self.rank}", 1)
        arrived = store.add("join/count", 1)
        if arrived == world:
            store.set("join/done", "1")
        deadline = time.monotonic() + timeout
        while True:
            try:
                store.wait(["join/done"], timedelta(seconds=min(1.0, timeout)))
                return
            except Exception as exc:
                if not is_timeout(exc):
                    raise PeerError(f"lost the rendezvous store while joining: {exc}") from None
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if not store.check([f"join/{r}/host"])]
                names = ", ".join(self.layout.role(r) for r in missing)
                raise PeerError(
                    f"{names} did not join within {timeout:g}s "
                    f"({JOIN_FACTOR} x distributed_timeout) at {self.address.method}"
                )

    def _check_configs(self, store: dist.Store) -> None:
        mine = config_to_dict(self.cfg)
        store.set(f"config/{self.rank}", json.dumps(mine, sort_keys=True))
        theirs = json.loads(store.get("config/0"))
        diff = _config_diff(mine, theirs)
        verdict = "ok" if not diff else ", ".join(diff)
        store.set(f"config_ok/{self.rank}", verdict)
        store_barrier(store, "config", self.layout.world_size, self.watchdog)
        bad = []
        for r in range(self.layout.world_size):
            v = store.get(f"config_ok/{r}").decode()
            if v != "ok":
                bad.append(f"{self.layout.role(r)} differs in {v}")
        # Everybody has read the verdicts before anybody (rank 0: the store host) leaves.
        store_barrier(store, "config-read", self.layout.world_size, self.watchdog)
        if bad:
            raise ConfigError(
                "the ranks were started with different configs (compared with rank 0's): "
                + "; ".join(bad) + ". Use the same config file and -p overrides everywhere"
            )

    def _init_groups(self) -> None:
        assert self.raw_store is not None
        td = timedelta(seconds=self.timeout)
        try:
            dist.init_process_group(
                "gloo", store=dist.PrefixStore("gloo", self.raw_store), rank=self.rank,
                world_size=self.layout.world_size, timeout=td,
            )
            self.trainer_group = dist.new_group(self.layout.trainers, timeout=td, backend="gloo")
        except RuntimeError as exc:
            raise PeerError(
                f"could not connect the gloo process group: {str(exc).strip().splitlines()[0]} "
                "(set GLOO_SOCKET_IFNAME to the network interface the machines share)"
            ) from None

    # ------------------------------------------------------------------ helpers
    def barrier(self, name: str, size: int | None = None) -> None:
        assert self.store is not None
        store_barrier(self.store, name, size or self.layout.num_trainers, self.watchdog)

    def fail(self, message: str) -> None:
        """Stop the run after a communication error (waits a moment for the dead peer's name)."""
        if self.watchdog is not None:
            self.watchdog.fail(message)
        self.on_fatal(message)

    def abort(self, message: str) -> None:
        """Stop the run at once after an error of this rank, telling the others why."""
        if self.store is not None:
            with contextlib.suppress(Exception):  # the others' watchdogs will notice anyway
                self.store.set("abort", f"{self.layout.role(self.rank)} failed: {message}")
        self.on_fatal(message)

    # ------------------------------------------------------------------ shutdown
    def on_fatal(self, message: str) -> None:
        """The end of a failed rank: leave (see :meth:`_leave`), print one line, exit non-zero."""
        self._leave(wait_s=min(self.timeout, 3.0))
        self._exit(message)

    def _leave(self, wait_s: float) -> None:
        """Say this rank is leaving; rank 0, which hosts the store, first waits (``wait_s`` at
        most) for the others to leave, so they can still read why the run ends."""
        store = self.store
        if store is None:
            return
        try:
            if self.rank != 0:
                store.set(f"exit/{self.rank}", "1")
                return
            deadline = time.monotonic() + wait_s
            others = [f"exit/{r}" for r in range(1, self.layout.world_size)]
            while others and time.monotonic() < deadline:
                others = [k for k in others if not store.check([k])]
                time.sleep(0.05)
        except Exception as exc:  # leaving anyway
            logger.debug("leaving: %s", exc)

    def close(self, clean: bool = True) -> None:
        """Leave: mark this rank finished; rank 0, the store host, waits for everybody first."""
        if self.watchdog is not None:
            self.watchdog.stop(clean=clean)
        self._leave(wait_s=self.timeout if clean else min(self.timeout, 3.0))
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        if clean and self.rank == 0 and self.address.kind == "file":
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)
        self.store = None
