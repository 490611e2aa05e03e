"""Joining and leaving a distributed run: store, handshake, config check, gloo groups, shutdown.

Start-up, on every rank (trainer or partition server):

1. connect to the rendezvous store (rank 0 hosts it for tcp://) and start the watchdog's
   lifeline, so a rank whose store stops answering (network partition, frozen rank 0, a foreign
   program on the port) exits after ``distributed_timeout``;
2. rank 0 publishes the run's shape (``num_machines``, ``num_partition_servers``); a rank
   started with another one refuses to join and says so, and every joining rank stops with that
   message (``join/refused``: also written by any rank whose join fails, so the others do not
   wait, or report a false "rank 0 is gone");
3. announce ``join/RANK`` (a second process claiming the same rank, or a stale file:// store,
   is refused) and wait up to ``JOIN_FACTOR x distributed_timeout`` for the whole world; with a
   shared secret (:mod:`bigembed.distributed.auth`) rank 0 instead admits each rank by a
   challenge-response over its nonce, refusing (and logging) any attempt without a valid proof,
   and every rank derives the run's session key, which signs the control messages;
4. watch the peers' heartbeats;
5. compare configs: every rank publishes its resolved config, and any difference from rank 0's
   stops every rank with a message naming the keys (PBG silently trusts they match);
6. create the gloo process groups: the world (partition transfers) and the trainers (shared
   parameters), with ``distributed_timeout`` on every operation.

Shutdown is ordered so that rank 0, which hosts the store, leaves last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from bigembed.communication import StrategyEnv, get_codec
from bigembed.config import ConfigSchema, config_to_dict
from bigembed.distributed.auth import BadMac, Secret, Session, load_secret, seal, unseal
from bigembed.distributed.handshake import (
    JOIN_FACTOR,
    REFUSED_MARK,
    Handshake,
    JoinRefusal,
    RelayedRefusal,
    host_id,
)
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.store import (
    StoreAddress,
    best_effort,
    choose_gloo_interface,
    store_set,
)
from bigembed.distributed.watchdog import Watchdog, exit_now, store_barrier
from bigembed.errors import ConfigError, PeerError
from bigembed.train import BatchGate

logger = logging.getLogger(__name__)


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
        self._ending = threading.Lock()  # held by the one thread that ends a failed run
        self._cleanups: list[Callable[[], None]] = []  # see on_exit
        self.raw_store: dist.Store | None = None
        self.store: dist.Store | None = None  # namespaced, for this (main) thread
        self.watchdog: Watchdog | None = None
        self.trainer_group: dist.ProcessGroup | None = None
        self.interface: str | None = None
        secret = load_secret()
        self.secret = Secret(secret) if secret is not None else None
        self.session: Session | None = None  # the run's key, once joined with a secret

    # ------------------------------------------------------------------ start-up
    def open(self) -> DistContext:
        try:
            return self._open()
        except dist.DistError as exc:
            raise self._refuse(
                PeerError(
                    f"{self.layout.role(self.rank)}: lost contact with the other ranks while "
                    f"joining ({str(exc).strip().splitlines()[0]})"
                )
            ) from None
        except PeerError as exc:
            raise self._refuse(exc) from None

    def _refuse(self, exc: PeerError) -> PeerError:
        """Tell the ranks still joining why this one gives up (they stop with its message):
        any failure of rank 0, the host, and a rank started with another shape of run. (A
        duplicate rank, or one with the wrong secret, must not stop the others.)"""
        store = self.store
        publish = isinstance(exc, JoinRefusal) or (
            self.rank == 0 and not isinstance(exc, RelayedRefusal)
        )
        if store is not None and publish:
            text = f"{REFUSED_MARK}{self.layout.role(self.rank)}: {exc}"
            best_effort(lambda: store_set(store, "join/refused", text), min(self.timeout, 2.0))
        return exc

    def _open(self) -> DistContext:
        world = self.layout.world_size
        self.interface = choose_gloo_interface(self.address)
        join_timeout = self.timeout * JOIN_FACTOR
        self.raw_store = self.address.open(
            self.rank, world, join_timeout, answer_within=self.timeout
        )
        store = self.store = self.address.namespaced(self.raw_store)
        with contextlib.suppress(Exception):  # not every store type has one
            store.set_timeout(timedelta(seconds=self.timeout))
        self.watchdog = Watchdog(
            self.address, self.rank, self.layout, self.timeout, on_fatal=self.on_fatal
        )
        self.watchdog.start()  # the lifeline: from now on, a dead store ends this rank
        if self.secret is None and self.address.kind == "tcp" and self.rank == 0:
            logger.info(
                "no shared secret (BIGEMBED_SECRET / BIGEMBED_SECRET_FILE): anybody who "
                "can reach %s:%d can join this run",
                self.address.host,
                self.address.port,
            )
        handshake = Handshake(self.cfg, self.rank, self.layout, self.address, self.secret)
        self.session = handshake.run(store, join_timeout)
        self.watchdog.session = self.session
        self.watchdog.watch_peers()
        self._check_configs(store)
        self._init_groups()
        logger.info(
            "%s joined %d-rank run at %s (gloo interface %s)",
            self.layout.role(self.rank),
            world,
            self.address.method,
            self.interface or "default",
        )
        return self

    def _check_configs(self, store: dist.Store) -> None:
        mine = config_to_dict(self.cfg)
        key = f"config/{self.rank}"
        store_set(store, key, seal(self.session, key, json.dumps(mine, sort_keys=True)))
        try:
            theirs = json.loads(unseal(self.session, "config/0", store.get("config/0")))
        except BadMac as exc:
            raise PeerError(
                f"rank 0's config is not signed with the run's secret ({exc}): "
                "somebody else writes to the rendezvous store"
            ) from None
        diff = _config_diff(mine, theirs)
        verdict = "ok" if not diff else ", ".join(diff)
        key = f"config_ok/{self.rank}"
        store_set(store, key, seal(self.session, key, verdict))
        store_barrier(store, "config", self.layout.world_size, self.watchdog)
        bad = []
        for r in range(self.layout.world_size):
            key = f"config_ok/{r}"
            try:
                v = unseal(self.session, key, store.get(key)).decode()
            except BadMac:
                v = "a verdict not signed with the run's secret"
            if v != "ok":
                bad.append(f"{self.layout.role(r)} differs in {v}")
        # Everybody has read the verdicts before anybody (rank 0: the store host) leaves.
        store_barrier(store, "config-read", self.layout.world_size, self.watchdog)
        if bad:
            raise ConfigError(
                "the ranks were started with different configs (compared with rank 0's): "
                + "; ".join(bad)
                + ". Use the same config file and -p overrides everywhere"
            )

    def _init_groups(self) -> None:
        assert self.raw_store is not None
        td = timedelta(seconds=self.timeout)
        try:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore("gloo", self.raw_store),
                rank=self.rank,
                world_size=self.layout.world_size,
                timeout=td,
            )
            self.trainer_group = dist.new_group(self.layout.trainers, timeout=td, backend="gloo")
        except RuntimeError as exc:
            raise PeerError(
                f"could not connect the gloo process group: {str(exc).strip().splitlines()[0]} "
                "(set GLOO_SOCKET_IFNAME to the network interface the machines share)"
            ) from None

    # ------------------------------------------------------------------ helpers
    def trainer_hosts(self) -> list[str]:
        """Each trainer's host name as it joined (``layout.trainers`` order)."""
        assert self.store is not None
        hosts = [self.store.get(f"join/{r}/host").decode() for r in self.layout.trainers]
        return [h.rpartition(":")[0] for h in hosts]

    def strategy_env(
        self, *, gate: BatchGate | None = None, sparse_rows: bool = False, replicas: bool = False
    ) -> StrategyEnv:
        """Where this trainer's communication strategy runs, from the config's
        ``communication`` section (``gate``: the run's, shared by a strategy per bucket;
        ``sparse_rows``: send row tables as row-sparse deltas; ``replicas``: data-parallel
        replicas of the same bucket)."""
        cfg, comm = self.cfg, self.cfg.communication
        return StrategyEnv(
            rank=self.rank,
            trainers=self.layout.trainers,
            group=self.trainer_group,
            codec=get_codec(comm.precision),
            workers=cfg.resolved_workers(),
            sync_every=comm.sync_every,
            sync_interval=comm.sync_interval,
            on_error=self.fail,
            gate=gate,
            sparse_rows=sparse_rows,
            replicas=replicas,
            row_fraction=comm.row_fraction,
            overlap=comm.overlap,
            hierarchical=comm.hierarchical,
            hosts=self.trainer_hosts(),
            store_client=lambda: self.address.namespaced(self.address.client(self.timeout)),
        )

    def local_trainers(self) -> int:
        """How many trainers of the run joined from this machine (by host name)."""
        me = host_id()
        return sum(1 for h in self.trainer_hosts() if h == me)

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
        if self.watchdog is not None:  # best effort: the others' watchdogs will notice anyway
            self.watchdog.publish_abort(f"{self.layout.role(self.rank)} failed: {message}")
        self.on_fatal(message)

    # ------------------------------------------------------------------ shutdown
    def on_fatal(self, message: str) -> None:
        """The end of a failed rank: leave (see :meth:`_leave`), print one line, exit non-zero.

        Leaving is bounded: on a dead connection its store calls would never return. Several
        threads can get here at once (the watchdog's verdict, and the main thread's failed call
        waiting for it in :meth:`fail`): the first ends the process, the others wait for that
        end, so the error is printed once."""
        if not self._ending.acquire(blocking=False):
            threading.Event().wait()  # never set: the first caller exits the process
        self._run_cleanups()
        wait_s = min(self.timeout, 3.0)
        if self.watchdog is None or not self.watchdog.store_lost:
            best_effort(lambda: self._leave(wait_s=wait_s), wait_s + 1.0)
        self._exit(message)

    def _leave(self, wait_s: float) -> None:
        """Say this rank is leaving; rank 0, which hosts the store, first waits (``wait_s`` at
        most) for the others to leave, so they can still read why the run ends (not for a rank
        whose heartbeat stopped: it cannot read anything)."""
        store = self.store
        if store is None:
            return
        try:
            if self.rank != 0:
                store.set(f"exit/{self.rank}", "1")
                return
            deadline = time.monotonic() + wait_s
            gone = self.watchdog.gone if self.watchdog is not None else set()
            others = [f"exit/{r}" for r in range(1, self.layout.world_size) if r not in gone]
            while others and time.monotonic() < deadline:
                others = [k for k in others if not store.check([k])]
                time.sleep(0.05)
        except Exception as exc:  # leaving anyway
            logger.debug("leaving: %s", exc)

    def on_exit(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` when this rank ends, also when it ends at once after a failure
        (which skips ``finally`` blocks: see :func:`~bigembed.distributed.watchdog.exit_now`)."""
        self._cleanups.append(cleanup)

    def _run_cleanups(self) -> None:
        while self._cleanups:
            cleanup = self._cleanups.pop()
            try:
                cleanup()
            except Exception as exc:  # ending anyway
                logger.debug("cleanup at exit: %s", exc)

    def close(self, clean: bool = True) -> None:
        """Leave: mark this rank finished; rank 0, the store host, waits for everybody first."""
        self._run_cleanups()
        if self.watchdog is not None:
            self.watchdog.stop(clean=clean)
        wait_s = self.timeout if clean else min(self.timeout, 3.0)
        best_effort(lambda: self._leave(wait_s=wait_s), wait_s + 1.0)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        if clean and self.rank == 0 and self.address.kind == "file":
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)
        self.store = None
