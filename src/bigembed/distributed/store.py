"""The rendezvous store: how ranks find each other, and the control plane they share.

``distributed_init_method`` names a torch.distributed store: ``tcp://HOST:PORT`` (rank 0 hosts a
TCPStore there), ``env://`` (the same, from MASTER_ADDR / MASTER_PORT) or ``file://PATH`` (a
FileStore on a shared disk). The store carries the join handshake, heartbeats, barriers and the
small request/reply messages of the lock and partition servers; bulk data goes over gloo.

Each thread that blocks on the store gets its own client connection (:meth:`StoreAddress.client`),
because a client serialises its operations: a server thread waiting for requests would otherwise
stall the heartbeat. Failures become one-line :class:`~bigembed.errors.PeerError` messages
(port in use, store unreachable) instead of c10d tracebacks.

Binding: a TCPStore master listens on every interface whatever host the URI names (checked with
torch 2.13). So rank 0 binds the store's socket itself (handed over through TCPStore's
``master_listen_fd``) to the host of ``tcp://HOST:PORT`` (``0.0.0.0`` means every interface), or
to ``BIGEMBED_BIND=ADDRESS`` (``--bind``) when set, which also points gloo at the interface
holding that address on every rank.

Under torchrun (``env://`` with ``TORCHELASTIC_USE_AGENT_STORE=True``), MASTER_ADDR:MASTER_PORT
is the elastic agent's own TCPStore, the one torch's ``env://`` rendezvous joins: every rank,
rank 0 included, connects to it as a client (as torch.distributed.rendezvous does) instead of
hosting one. The agent keeps that store across worker restarts (``--max-restarts``, and an
elastic run's change of membership), so every key of a rank goes under
``bigembed-attempt-N-W/`` (N: ``TORCHELASTIC_RESTART_COUNT``, W: ``WORLD_SIZE``), keeping a
restarted run clear of the keys of the attempt that failed. Every agent counts the restarts
alike because a failed rank ends every rank of the run, so every node's worker group fails.

Deadlines: a TCPStore client call has no timeout on a dead connection (a network partition, a
frozen rank 0, or another program holding the port that accepts but never answers): ``add``,
``set`` and even the client's constructor block forever. Connecting is therefore bounded here
(:meth:`StoreAddress.client`: first wait for something to accept on the port, then give the
store ``answer_within`` seconds to answer), and the watchdog's lifeline
(:mod:`bigembed.distributed.watchdog`) ends a rank whose store calls stop completing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar, cast
from urllib.parse import urlparse

import torch.distributed as dist

from bigembed.distributed.auth import BIND_ENV
from bigembed.errors import PeerError

T = TypeVar("T")
logger = logging.getLogger(__name__)

NAMESPACE = "bigembed"
_LISTENERS: list[socket.socket] = []  # bound sockets handed to TCPStore: kept open while it runs


def is_timeout(exc: BaseException) -> bool:
    """A store wait that ran out of time (as opposed to a lost connection)."""
    if isinstance(exc, dist.DistNetworkError):
        return False
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


class DeadlineExceeded(Exception):
    """A call run by :func:`call_with_deadline` did not return in time (it is left running)."""


def call_with_deadline(fn: Callable[[], T], seconds: float, name: str = "bigembed-call") -> T:
    """``fn()`` on a helper thread; raises DeadlineExceeded if it takes more than ``seconds``.

    For store calls that may block forever on a dead connection: the helper thread is a daemon
    and is abandoned (the process is about to stop anyway). ``fn``'s exceptions are re-raised.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeadlineExceeded(f"no answer within {seconds:g}s")
    if "error" in box:
        raise cast(BaseException, box["error"])
    return cast(T, box["value"])


def best_effort(fn: Callable[[], object], seconds: float) -> bool:
    """``fn()`` within ``seconds``, ignoring any failure; True if it completed."""
    try:
        call_with_deadline(fn, seconds, name="bigembed-best-effort")
    except Exception:
        return False
    return True


def store_set(store: dist.Store, key: str, value: str | bytes) -> None:
    """``store.set(key, value)`` for a text or a sealed (bytes) value.

    c10d binds the value as a C++ ``std::string``, which pybind11 fills from str (UTF-8) and
    bytes alike; torch's stub only admits ``str``, hence the cast.
    """
    store.set(key, cast(str, value))


@dataclass(frozen=True)
class StoreAddress:
    method: str
    kind: str  # "tcp" or "file"
    host: str = ""
    port: int = 0
    path: str = ""
    attempt: str = ""  # non-empty: the launcher's agent hosts the store; this attempt's prefix

    @staticmethod
    def parse(method: str) -> StoreAddress:
        url = urlparse(method)
        if url.scheme == "env":
            host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not host or not port:
                raise PeerError(
                    f"distributed_init_method {method}: MASTER_ADDR and MASTER_PORT must be set"
                )
            tcp = StoreAddress.parse(f"tcp://{host}:{port}")
            attempt = ""
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                world = os.environ.get("WORLD_SIZE", "")
                attempt = f"bigembed-attempt-{restart}-{world}"
            return StoreAddress(method, "tcp", tcp.host, tcp.port, attempt=attempt)
        if url.scheme == "tcp":
            if not url.hostname or url.port is None:
                raise PeerError(f"distributed_init_method {method}: expected tcp://HOST:PORT")
            return StoreAddress(method, "tcp", host=url.hostname, port=url.port)
        if url.scheme == "file":
            path = url.path if not url.netloc else url.netloc + url.path
            if not path:
                raise PeerError(f"distributed_init_method {method}: expected file:///PATH")
            return StoreAddress(method, "file", path=path)
        raise PeerError(
            f"distributed_init_method {method}: unsupported scheme {url.scheme!r} "
            "(use tcp://HOST:PORT, file:///PATH or env://)"
        )

    # ------------------------------------------------------------------ connections
    def open(
        self, rank: int, world_size: int, timeout: float, answer_within: float | None = None
    ) -> dist.Store:
        """The raw store of this rank (rank 0 hosts it for tcp://, unless torchrun's agent does).

        The other ranks wait up to ``timeout`` for rank 0 to listen, then ``answer_within``
        (default ``timeout``) for the store to answer (see :meth:`client`)."""
        td = timedelta(seconds=timeout)
        if self.kind == "file":
            parent = os.path.dirname(self.path) or "."
            if not os.path.isdir(parent):
                raise PeerError(f"{self.method}: directory {parent} does not exist")
            try:
                return dist.FileStore(self.path, -1)
            except RuntimeError as exc:
                raise PeerError(f"{self.method}: cannot open the store file: {exc}") from None
        if rank == 0 and not self.attempt:
            bind = os.environ.get(BIND_ENV) or self.host
            listener = _bound_listener(bind, self.port, self.method)
            try:
                return dist.TCPStore(
                    self.host,
                    self.port,
                    world_size,
                    is_master=True,
                    timeout=td,
                    wait_for_workers=False,
                    master_listen_fd=listener.fileno(),
                )
            except (RuntimeError, dist.DistError) as exc:
                text = str(exc)
                if "EADDRINUSE" in text or "address already in use" in text.lower():
                    raise PeerError(
                        f"{self.method}: port {self.port} is already in use on this machine "
                        "(another run, or one still shutting down); pick another port"
                    ) from None
                raise PeerError(
                    f"{self.method}: rank 0 cannot host the rendezvous store: {_first_line(text)}"
                ) from None
        return self.client(timeout, connect_within=timeout, answer_within=answer_within)

    def client(
        self,
        timeout: float,
        *,
        connect_within: float | None = None,
        answer_within: float | None = None,
    ) -> dist.Store:
        """One more client connection to the store (for a thread that blocks on it).

        ``timeout`` is the connection's wait/get timeout. Something must accept on the port
        within ``connect_within`` seconds (default ``timeout``: rank 0 may start later) and
        then answer the store's handshake within ``answer_within`` (default ``timeout``):
        TCPStore's own constructor waits forever for a listener that never answers.
        """
        td = timedelta(seconds=timeout)
        if self.kind == "file":
            return dist.FileStore(self.path, -1)
        connect_within = timeout if connect_within is None else connect_within
        answer_within = timeout if answer_within is None else answer_within
        self._wait_for_listener(connect_within)
        try:
            store: dist.Store = call_with_deadline(
                lambda: dist.TCPStore(self.host, self.port, is_master=False, timeout=td),
                answer_within,
                name="bigembed-store-connect",
            )
            return dist.PrefixStore(self.attempt, store) if self.attempt else store
        except DeadlineExceeded:
            raise PeerError(
                f"the rendezvous store at {self.method} accepts connections but does not answer "
                f"within {answer_within:g}s: another program holds {self.host}:{self.port} (pick "
                "another port), or rank 0 is frozen"
            ) from None
        except (RuntimeError, dist.DistError) as exc:
            raise PeerError(
                f"cannot reach the rendezvous store at {self.method} within {timeout:g}s: is "
                f"rank 0 running, and is {self.host}:{self.port} reachable from this machine? "
                f"({_first_line(str(exc))})"
            ) from None

    def _wait_for_listener(self, seconds: float) -> None:
        """Wait until something accepts connections at host:port (PeerError after ``seconds``)."""
        deadline = time.monotonic() + seconds
        last = "no attempt"
        while True:
            left = deadline - time.monotonic()
            try:
                probe = max(0.1, min(left, 2.0))
                with socket.create_connection((self.host, self.port), timeout=probe):
                    return
            except OSError as exc:
                last = exc.strerror or str(exc)
            if time.monotonic() + 0.2 > deadline:
                raise PeerError(
                    f"cannot reach the rendezvous store at {self.method} within {seconds:g}s: is "
                    f"rank 0 running, and is {self.host}:{self.port} reachable from this machine? "
                    f"({last})"
                )
            time.sleep(0.2)

    def namespaced(self, store: dist.Store) -> dist.Store:
        return dist.PrefixStore(NAMESPACE, store)


def _bound_listener(bind: str, port: int, method: str) -> socket.socket:
    """A listening socket on ``bind``:``port`` for the store master."""
    where = f"{BIND_ENV} {bind}" if os.environ.get(BIND_ENV) else f"{method}: host {bind}"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise PeerError(f"{where}: not an address ({exc.strerror})") from None
    if _is_loopback_name(bind, str(addr[0])):
        logger.warning(
            "%s: %s resolves to %s on this machine, a loopback address: only ranks on this "
            "machine can reach the store; name an address the others can reach (or --bind it)",
            method,
            bind,
            addr[0],
        )
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PeerError(
                f"{method}: port {port} is already in use on {bind} (another run, or one still "
                "shutting down); pick another port"
            ) from None
        raise PeerError(
            f"{where}: rank 0 cannot listen there ({exc.strerror}); name an address of this "
            "machine (or 0.0.0.0 for every interface)"
        ) from None
    _LISTENERS.append(sock)
    return sock


def host_agent_store(timeout: float) -> tuple[dist.Store, str, int]:
    """The TCPStore master of a launcher's elastic agent, on a free port of ``BIGEMBED_BIND``'s
    address (``--bind``), else of 127.0.0.1, listening there only. Returns it, the host the
    workers reach it at (127.0.0.1 for a wildcard bind) and its port.

    torch's static rendezvous opens the agent's store itself, as a TCPStore master with
    ``multi_tenant=True``, which listens on every interface. TCPStores of one process opened
    with ``multi_tenant`` on one port share one server: opened here first on a socket bound to
    the address, this one is the server the rendezvous then uses. Keep the returned store
    referenced while the agent runs."""
    bind = os.environ.get(BIND_ENV) or "127.0.0.1"
    host = bind
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(bind).is_unspecified:
            host = "127.0.0.1"
    listener = _bound_listener(bind, 0, f"tcp://{host}:0")
    port = int(listener.getsockname()[1])
    store = dist.TCPStore(
        host,
        port,
        1,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.fileno(),
    )
    return store, host, port


def _is_loopback_name(name: str, address: str) -> bool:
    """``name`` is a host name (not an address, not "localhost") that resolves to a loopback
    address, as a Debian machine's own name does (127.0.1.1 in /etc/hosts)."""
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        pass
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
    return loopback and name != "localhost"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# ---------------------------------------------------------------------- gloo's network interface
def local_address_towards(host: str, port: int) -> str | None:
    """The local IPv4 address this machine would use to reach ``host`` (no packet is sent)."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, port or 9))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """Name of the local interface holding IPv4 ``address`` (Linux ioctl SIOCGIFADDR)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                req = struct.pack("256s", name.encode()[:15])
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, req)
                if socket.inet_ntoa(raw[20:24]) == address:
                    return name
    return None


def choose_gloo_interface(address: StoreAddress) -> str | None:
    """Point gloo at the interface that reaches the store host, unless the user chose one.

    Gloo otherwise binds to whatever the machine's hostname resolves to, which in containers
    and network namespaces is often an address the peers cannot reach.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ.get("GLOO_SOCKET_IFNAME")
    bind = os.environ.get(BIND_ENV)
    if bind:
        try:
            local: str | None = socket.gethostbyname(bind)
        except OSError:
            local = None
    elif address.kind != "tcp":
        return None
    else:
        local = local_address_towards(address.host, address.port)
    name = interface_of(local) if local else None
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True
