"""Joining a run through the rendezvous store: the run's shape, the rank claims, the secret.

Steps 2 and 3 of :mod:`bigembed.distributed.context`'s start-up. Rank 0 publishes the run's
shape (``num_machines``, ``num_partition_servers``), a digest of its graph's manifests (each
machine may read its own copy of the graph: the copies must be the same import) and whether the
run needs the shared secret; a rank started with another shape or graph refuses to join, and
every joining rank stops with its message (``join/refused``). Without a secret each rank claims
its number (a second claim is refused) and waits for the whole world. With one
(:mod:`bigembed.distributed.auth`), rank 0 admits each rank by a challenge-response over its
nonce, refusing (and logging) any attempt without a valid proof, and every rank derives the
run's session key, which signs the control messages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from bigembed.config import ConfigSchema
from bigembed.distributed.auth import MODE_HMAC, MODE_NONE, Secret, Session, proof_ok
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.store import StoreAddress, is_timeout
from bigembed.errors import BigembedError, PeerError
from bigembed.storage import EDGE_FORMAT, ENTITY_FORMAT, read_manifest

logger = logging.getLogger(__name__)

JOIN_FACTOR = 5  # ranks started by hand may arrive a while apart
REFUSED_MARK = "refused: "  # a join/refused value: the rank and its reason follow


class JoinRefusal(PeerError):
    """A join failure every joining rank must hear of (not a duplicate or a stranger's)."""


class RelayedRefusal(PeerError):
    """Another rank's refusal, read from ``join/refused`` (not published again)."""


def check_refused(store: dist.Store) -> None:
    """Raise the message of a rank that gave up joining (published as ``join/refused``)."""
    if store.check(["join/refused"]):
        text = store.get("join/refused").decode(errors="replace")
        raise RelayedRefusal(text[len(REFUSED_MARK) :] if text.startswith(REFUSED_MARK) else text)


def _graph_stores(cfg: ConfigSchema) -> list[tuple[str, str, str]]:
    """(config key, path, format) of each store of the graph."""
    stores = [("entity_path", str(cfg.entity_path), ENTITY_FORMAT)]
    stores += [(f"edge_paths[{i}]", str(p), EDGE_FORMAT) for i, p in enumerate(cfg.edge_paths)]
    return stores


def graph_digests(cfg: ConfigSchema) -> dict[str, str]:
    """A digest of each store's manifest (its import id, counts, buckets), by config key; a
    store this machine cannot read is left out (opening the graph reports it later)."""
    out = {}
    for key, path, fmt in _graph_stores(cfg):
        try:
            manifest = read_manifest(Path(path), fmt)
        except (BigembedError, OSError):
            continue
        text = json.dumps(manifest, sort_keys=True).encode()
        out[key] = hashlib.sha256(text).hexdigest()[:32]
    return out


class Handshake:
    """One rank's join: :meth:`run` returns the run's session key (None without a secret)."""

    def __init__(
        self,
        cfg: ConfigSchema,
        rank: int,
        layout: RankLayout,
        address: StoreAddress,
        secret: Secret | None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.layout = layout
        self.address = address
        self.secret = secret
        self._nonce = ""  # rank 0's challenge (with a secret)

    def run(self, store: dist.Store, timeout: float) -> Session | None:
        """Agree on the run's shape and secret, then join; waits up to ``timeout`` for the
        whole world."""
        world = self.layout.world_size
        if self._auth_mode(store, timeout) == MODE_HMAC:
            return self._join_with_secret(store, world, timeout)
        self._join(store, world, timeout)
        return None

    def _join(self, store: dist.Store, world: int, timeout: float) -> None:
        claims = store.add(f"join/{self.rank}/claims", 1)
        if claims > 1:
            where = (
                f" or {self.address.path} is left over from an earlier run (delete it)"
                if self.address.kind == "file"
                else ""
            )
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
            check_refused(store)
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if not store.check([f"join/{r}/host"])]
                names = ", ".join(self.layout.role(r) for r in missing)
                raise PeerError(
                    f"{names} did not join within {timeout:g}s "
                    f"({JOIN_FACTOR} x distributed_timeout) at {self.address.method}"
                )

    def _wait_key(self, store: dist.Store, key: str, timeout: float, what: str) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            try:
                store.wait([key], timedelta(seconds=min(1.0, timeout)))
                return store.get(key)
            except Exception as exc:
                if not is_timeout(exc):
                    raise PeerError(f"lost the rendezvous store while joining: {exc}") from None
            check_refused(store)
            if time.monotonic() > deadline:
                raise PeerError(f"{what} within {timeout:g}s at {self.address.method}")

    def _shape(self) -> str:
        return (
            f"num_machines={self.cfg.num_machines}, "
            f"num_partition_servers={max(self.cfg.num_partition_servers, 0)}"
        )

    def _auth_mode(self, store: dist.Store, timeout: float) -> str:
        """Rank 0 says whether the run needs the secret and what shape it has; the others
        check they agree."""
        mine = MODE_HMAC if self.secret is not None else MODE_NONE
        if self.rank == 0:
            store.set("join/shape", self._shape())
            store.set("join/graph", json.dumps(graph_digests(self.cfg)))
            if self.secret is not None:
                self._nonce = secrets.token_hex(32)
                store.set("auth/nonce", self._nonce)
            store.set("auth/mode", mine)
            return mine
        theirs = self._wait_key(store, "auth/mode", timeout, "rank 0 did not start").decode()
        shape = store.get("join/shape").decode(errors="replace")
        if shape != self._shape():
            raise JoinRefusal(
                f"{self.layout.role(self.rank)} was started with {self._shape()} but rank 0 "
                f"with {shape}: use the same config and -p overrides on every rank"
            )
        if self.layout.is_trainer(self.rank) and store.check(["join/graph"]):
            self._check_graph(store.get("join/graph").decode(errors="replace"))
        if theirs == MODE_HMAC and self.secret is None:
            raise PeerError(
                f"the run at {self.address.method} requires the shared secret: set "
                "BIGEMBED_SECRET or BIGEMBED_SECRET_FILE (or --secret-file) on this rank too"
            )
        if theirs != MODE_HMAC and self.secret is not None:
            raise PeerError(
                f"rank 0 of the run at {self.address.method} runs without a shared secret but "
                "this rank has one: set the same secret on every rank (or on none)"
            )
        return theirs

    def _check_graph(self, published: str) -> None:
        """Refuse a trainer whose copy of the graph is another import than rank 0's."""
        try:
            theirs = json.loads(published)
        except ValueError:
            theirs = {}
        mine = graph_digests(self.cfg)
        paths = {key: path for key, path, _ in _graph_stores(self.cfg)}
        for key, digest in mine.items():
            if isinstance(theirs, dict) and key in theirs and theirs[key] != digest:
                path = paths[key]
                raise JoinRefusal(
                    f"{self.layout.role(self.rank)} reads another graph than rank 0: the "
                    f"manifest of {key} ({path}) differs (another import, or an incomplete "
                    "copy): give every machine the same copy of the imported graph"
                )

    def _join_with_secret(self, store: dist.Store, world: int, timeout: float) -> Session:
        assert self.secret is not None
        store.set(f"join/{self.rank}/host", f"{socket.gethostname()}:{os.getpid()}")
        store.add(f"hb/{self.rank}", 1)
        if self.rank == 0:
            self._admit(store, world, timeout)
            return self.secret.session(self._nonce)
        nonce = store.get("auth/nonce").decode()
        mine = secrets.token_hex(16)
        attempt = int(store.add(f"auth/{self.rank}/attempts", 1))
        key = f"auth/{self.rank}/{attempt}"
        store.set(
            key,
            json.dumps(
                {
                    "client_nonce": mine,
                    "proof": self.secret.join_proof(nonce, self.rank, mine),
                    "host": f"{socket.gethostname()}:{os.getpid()}",
                }
            ),
        )
        raw = self._wait_key(
            store,
            f"{key}/verdict",
            timeout,
            "rank 0 did not admit this rank (are all ranks started?)",
        )
        try:
            verdict = json.loads(raw)
        except ValueError:
            verdict = {}
        if not isinstance(verdict, dict):
            verdict = {}
        if verdict.get("ok") is True:
            welcome = self.secret.welcome_proof(nonce, self.rank, mine)
            if not proof_ok(welcome, verdict.get("proof")):
                raise PeerError(
                    f"the rendezvous store at {self.address.method} answered without proof of "
                    "the shared secret: it is not this run's rank 0"
                )
            return self.secret.session(nonce)
        raise PeerError(f"rank 0 refused this rank: {verdict.get('reason', 'no reason given')}")

    def _admit(self, store: dist.Store, world: int, timeout: float) -> None:
        """Rank 0: admit the first attempt per rank that proves the secret, refuse the others;
        answer the admitted ones once all have joined (so a welcome means: the run starts)."""
        assert self.secret is not None
        admitted: dict[int, tuple[str, str]] = {}  # rank -> (its client nonce, attempt key)
        pending: dict[int, set[int]] = {r: set() for r in range(1, world)}
        seen = dict.fromkeys(range(1, world), 0)
        deadline = time.monotonic() + timeout

        def refuse(key: str, reason: str, host: str) -> None:
            logger.warning("refused a join as %s from %s: %s", key.split("/")[1], host, reason)
            store.set(f"{key}/verdict", json.dumps({"ok": False, "reason": reason}))

        while len(admitted) < world - 1:
            for r in range(1, world):
                count = int(store.add(f"auth/{r}/attempts", 0))
                pending[r].update(range(seen[r] + 1, count + 1))
                seen[r] = max(seen[r], count)
                for attempt in sorted(pending[r]):
                    key = f"auth/{r}/{attempt}"
                    if not store.check([key]):
                        continue  # counted, not written yet
                    pending[r].discard(attempt)
                    try:
                        claim = json.loads(store.get(key))
                        cn, proof = str(claim["client_nonce"]), claim["proof"]
                        host = str(claim.get("host", "?"))
                    except (ValueError, KeyError, TypeError):
                        refuse(key, "malformed join request", "?")
                        continue
                    if not proof_ok(self.secret.join_proof(self._nonce, r, cn), proof):
                        refuse(
                            key,
                            "wrong shared secret (BIGEMBED_SECRET / BIGEMBED_SECRET_FILE "
                            "must be the same on every rank)",
                            host,
                        )
                    elif r in admitted:
                        refuse(
                            key,
                            f"rank {r} is already taken: another process joined as rank {r}",
                            host,
                        )
                    else:
                        admitted[r] = (cn, key)
            if len(admitted) == world - 1:
                break
            check_refused(store)
            if time.monotonic() > deadline:
                names = ", ".join(self.layout.role(r) for r in range(1, world) if r not in admitted)
                raise PeerError(
                    f"{names} did not join within {timeout:g}s ({JOIN_FACTOR} x "
                    f"distributed_timeout) at {self.address.method}"
                )
            time.sleep(0.05)
        for r, (cn, key) in admitted.items():
            store.set(
                f"{key}/verdict",
                json.dumps({"ok": True, "proof": self.secret.welcome_proof(self._nonce, r, cn)}),
            )
        store.set("join/done", "1")
