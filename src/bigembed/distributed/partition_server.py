"""Partition servers: hold the partitions nobody is training, with their row-Adagrad state.

Partition ``p`` of every entity type lives on server ``p mod S``. A server keeps the latest
copy of each partition it has been given (the trainers' working copy between buckets and
between steps); a partition it does not have yet is read by the trainer from the checkpoint
directory, as on a single machine.

Protocol (control over the store channel ``parts/RANK``, data over gloo point-to-point):

* ``get``: reply ``{found, shape}``; if found the server sends the embeddings and then the
  optimizer state (tags from :func:`data_tag` and the request number ``n``);
* ``put``: reply ``{ready}``; the client sends both tensors; the server stores them and writes
  an ``ack``, which the client waits for before it releases the partition's lock, so the next
  reader can never see the old copy.

Transfers run on a small thread pool so that one large partition does not hold up the
requests of other trainers. The trainer hosting the server (``num_partition_servers: -1``)
bypasses all of this and copies in memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from bigembed.distributed.auth import Session
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.rpc import Message, RpcClient, RpcServer
from bigembed.distributed.store import StoreAddress, store_set
from bigembed.errors import PeerError
from bigembed.partition_keys import PartitionKey
from bigembed.train.step import Table

logger = logging.getLogger(__name__)


def channel_of(rank: int) -> str:
    return f"parts/{rank}"


def data_tag(server: int, n: int, part: int) -> int:
    """Gloo tag of request ``n``'s tensor ``part`` (0: embeddings, 1: state) on ``server``.

    Unique per server *and* request: a rank may at once receive a partition from server A
    (request n of A) and, as a server itself, a partition from A's host (request n of its own
    queue); same (source, tag) pairs would let gloo swap the two messages. 18 bits of request
    number (it wraps, but never while the same number is in flight), 12 of server rank.
    """
    return (((n % (1 << 18)) << 12 | (server % (1 << 12))) << 1) | part


class PartitionServer:
    def __init__(
        self,
        rank: int,
        address: StoreAddress,
        timeout: float,
        on_error: Callable[[str], None],
        group: dist.ProcessGroup | None = None,
        threads: int = 4,
        session: Session | None = None,
    ) -> None:
        self.rank = rank
        self.address = address
        self.timeout = timeout
        self.on_error = on_error
        self.group = group
        self.tables: dict[PartitionKey, Table] = {}
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bigembed-parts")
        store = address.namespaced(address.client(timeout))
        self.rpc = RpcServer(
            store,
            channel_of(rank),
            self._handle,
            on_error,
            poll=0.5,
            name="bigembed-partition-server",
            session=session,
        )
        self.bytes_sent = 0
        self.bytes_received = 0

    def start(self) -> None:
        self.rpc.start()

    def stop(self) -> None:
        self.rpc.stop()
        self._pool.shutdown(wait=True)
        self.stopped.set()

    # ------------------------------------------------------------------ in-process access
    def get_local(self, key: PartitionKey, out_emb: torch.Tensor, out_state: torch.Tensor) -> bool:
        with self._lock:
            table = self.tables.get(key)
        if table is None:
            return False
        _check_shape(key, table.emb, out_emb, f"partition server on rank {self.rank}")
        out_emb.copy_(table.emb)
        out_state.copy_(table.state)
        return True

    def put_local(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None:
        with self._lock:
            table = self.tables.get(key)
            if table is None or table.emb.shape != emb.shape:
                table = Table(
                    torch.empty_like(emb, memory_format=torch.contiguous_format),
                    torch.empty_like(state),
                )
                self.tables[key] = table
        table.emb.copy_(emb)
        table.state.copy_(state)

    # ------------------------------------------------------------------ remote requests
    def _reply_store(self) -> dist.Store:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self.address.namespaced(self.address.client(self.timeout))
            self._local.store = store
        return store

    def _handle(self, req: Message) -> Message | None:
        op = req["op"]
        if op == "stop":
            threading.Thread(target=self.stop, daemon=True).start()
            return {"ok": True}
        key = (str(req["key"][0]), int(req["key"][1]))
        client, n = int(req["client"]), int(req["seq"])
        if op == "get":
            with self._lock:
                table = self.tables.get(key)
            if table is None:
                return {"found": False}
            self._pool.submit(self._guard, self._send, table, client, n)
            return {"found": True, "shape": list(table.emb.shape)}
        if op == "put":
            rows, dim = (int(x) for x in req["shape"])
            with self._lock:
                table = self.tables.get(key)
            if table is None or tuple(table.emb.shape) != (rows, dim):
                table = Table(torch.empty((rows, dim)), torch.empty(rows))
            self._pool.submit(self._guard, self._receive, key, table, client, n)
            return {"ready": True}
        raise ValueError(f"unknown partition server request {op!r}")

    def _guard(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"partition server on rank {self.rank}: transfer failed: {exc}")

    def _send(self, table: Table, client: int, n: int) -> None:
        dist.send(table.emb, dst=client, group=self.group, tag=data_tag(self.rank, n, 0))
        dist.send(table.state, dst=client, group=self.group, tag=data_tag(self.rank, n, 1))
        self.bytes_sent += (table.emb.numel() + table.state.numel()) * 4

    def _receive(self, key: PartitionKey, table: Table, client: int, n: int) -> None:
        dist.recv(table.emb, src=client, group=self.group, tag=data_tag(self.rank, n, 0))
        dist.recv(table.state, src=client, group=self.group, tag=data_tag(self.rank, n, 1))
        with self._lock:
            self.tables[key] = table
        self.bytes_received += (table.emb.numel() + table.state.numel()) * 4
        store_set(self._reply_store(), *self.rpc.encode(n, {"ok": True}, suffix="ack"))


def _shape_message(key: PartitionKey, have: tuple, want: tuple, where: str) -> str:
    return (
        f"{where} holds partition {key[1]} of '{key[0]}' with shape {have}, but this "
        f"trainer expects {want} (do all ranks use the same graph?)"
    )


def _check_shape(key: PartitionKey, have: torch.Tensor, want: torch.Tensor, where: str) -> None:
    if tuple(have.shape) != tuple(want.shape):
        raise PeerError(_shape_message(key, tuple(have.shape), tuple(want.shape), where))


class PartitionClient:
    """A trainer's access to the partition servers (a ``PartitionRemote`` for PartitionStore)."""

    def __init__(
        self,
        rank: int,
        layout: RankLayout,
        store: dist.Store,
        timeout: float,
        local: PartitionServer | None,
        group: dist.ProcessGroup | None = None,
        session: Session | None = None,
    ) -> None:
        self.rank = rank
        self.session = session
        self.layout = layout
        self.kv = store
        self.timeout = timeout
        self.local = local
        self.group = group
        self.bytes_sent = 0
        self.bytes_received = 0

    def _rpc(self, server: int) -> RpcClient:
        return RpcClient(
            self.kv, channel_of(server), self.timeout, self.layout.role(server), self.session
        )

    def fetch(self, key: PartitionKey, out_emb: torch.Tensor, out_state: torch.Tensor) -> bool:
        server = self.layout.server_for(key)
        if server == self.rank and self.local is not None:
            return self.local.get_local(key, out_emb, out_state)
        rpc = self._rpc(server)
        n = rpc.send({"op": "get", "key": list(key), "client": self.rank})
        reply = rpc.receive(n)
        if not reply["found"]:
            return False
        if tuple(reply["shape"]) != tuple(out_emb.shape):
            raise PeerError(
                _shape_message(
                    key, tuple(reply["shape"]), tuple(out_emb.shape), self.layout.role(server)
                )
            )
        try:
            dist.recv(out_emb, src=server, group=self.group, tag=data_tag(server, n, 0))
            dist.recv(out_state, src=server, group=self.group, tag=data_tag(server, n, 1))
        except RuntimeError as exc:
            raise PeerError(
                f"receiving a partition from {self.layout.role(server)} failed: {exc}"
            ) from None
        self.bytes_received += (out_emb.numel() + out_state.numel()) * 4
        return True

    def store(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None:
        server = self.layout.server_for(key)
        if server == self.rank and self.local is not None:
            self.local.put_local(key, emb, state)
            return
        rpc = self._rpc(server)
        n = rpc.send({"op": "put", "key": list(key), "client": self.rank, "shape": list(emb.shape)})
        rpc.receive(n)
        try:
            dist.send(emb.contiguous(), dst=server, group=self.group, tag=data_tag(server, n, 0))
            dist.send(state.contiguous(), dst=server, group=self.group, tag=data_tag(server, n, 1))
        except RuntimeError as exc:
            raise PeerError(
                f"sending a partition to {self.layout.role(server)} failed: {exc}"
            ) from None
        rpc.receive(n, suffix="ack")
        self.bytes_sent += (emb.numel() + state.numel()) * 4

    def stop_server(self, server: int) -> None:
        self._rpc(server).call({"op": "stop"})
