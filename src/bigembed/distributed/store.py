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
torch 2.13). ``BIGEMBED_BIND=ADDRESS`` (or ``--bind``) makes rank 0 bind the store's socket to
that address only (through TCPStore's ``master_listen_fd``) and, on every rank, points gloo at
the interface holding that address.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import cast
from urllib.parse import urlparse

import torch.distributed as dist

from bigembed.distributed.auth import BIND_ENV
from bigembed.errors import PeerError

NAMESPACE = "bigembed"
_LISTENERS: list[socket.socket] = []  # bound sockets handed to TCPStore: kept open while it runs


def is_timeout(exc: BaseException) -> bool:
    """A store wait that ran out of time (as opposed to a lost connection)."""
    if isinstance(exc, dist.DistNetworkError):
        return False
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


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

    @staticmethod
    def parse(method: str) -> StoreAddress:
        url = urlparse(method)
        if url.scheme == "env":
            host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not host or not port:
                raise PeerError(
                    f"distributed_init_method {method}: MASTER_ADDR and MASTER_PORT must be set"
                )
            return StoreAddress.parse(f"tcp://{host}:{port}")._replace_method(method)
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

    def _replace_method(self, method: str) -> StoreAddress:
        return StoreAddress(method, self.kind, self.host, self.port, self.path)

    # ------------------------------------------------------------------ connections
    def open(self, rank: int, world_size: int, timeout: float) -> dist.Store:
        """The raw store of this rank (rank 0 hosts it for tcp://)."""
        td = timedelta(seconds=timeout)
        if self.kind == "file":
            parent = os.path.dirname(self.path) or "."
            if not os.path.isdir(parent):
                raise PeerError(f"{self.method}: directory {parent} does not exist")
            try:
                return dist.FileStore(self.path, -1)
            except RuntimeError as exc:
                raise PeerError(f"{self.method}: cannot open the store file: {exc}") from None
        if rank == 0:
            listener = _bound_listener(os.environ.get(BIND_ENV), self.port, self.method)
            try:
                return dist.TCPStore(
                    self.host,
                    self.port,
                    world_size,
                    is_master=True,
                    timeout=td,
                    wait_for_workers=False,
                    master_listen_fd=listener.fileno() if listener is not None else None,
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
        return self.client(timeout)

    def client(self, timeout: float) -> dist.Store:
        """One more client connection to the store (for a thread that blocks on it)."""
        td = timedelta(seconds=timeout)
        if self.kind == "file":
            return dist.FileStore(self.path, -1)
        try:
            return dist.TCPStore(self.host, self.port, is_master=False, timeout=td)
        except (RuntimeError, dist.DistError) as exc:
            raise PeerError(
                f"cannot reach the rendezvous store at {self.method} within {timeout:g}s: is "
                f"rank 0 running, and is {self.host}:{self.port} reachable from this machine? "
                f"({_first_line(str(exc))})"
            ) from None

    def namespaced(self, store: dist.Store) -> dist.Store:
        return dist.PrefixStore(NAMESPACE, store)


def _bound_listener(bind: str | None, port: int, method: str) -> socket.socket | None:
    """A listening socket on ``bind``:``port`` for the store master, or None (every interface)."""
    if not bind:
        return None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise PeerError(f"{BIND_ENV} {bind}: not an address ({exc.strerror})") from None
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
            f"{BIND_ENV} {bind}: rank 0 cannot listen there ({exc.strerror}); name an address "
            "of this machine"
        ) from None
    _LISTENERS.append(sock)
    return sock


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (for ``bigembed launch``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
