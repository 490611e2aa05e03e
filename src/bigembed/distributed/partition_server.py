"""Partition servers: hold the partitions nobody is training, with their row-Adagrad state.

Partition ``p`` of every entity type lives on server ``p mod S``. A server keeps the latest
copy of each partition it has been given (the trainers' working copy between buckets and
between steps); a partition it does not have yet is read by the trainer from the checkpoint
directory, as on a single machine. Without a shared disk rank 0 gives the servers every
partition at start (:mod:`bigembed.distributed.no_shared_disk`), so none is ever missing.

Protocol (control over the store channel ``parts/RANK``, data over gloo point-to-point):

* ``get``: reply ``{found, shape}``; if found the server sends the embeddings and then the
  optimizer state (tags from :func:`data_tag` and the request number ``n``);
* ``put``: reply ``{ready}``; the client sends both tensors; the server stores them and writes
  an ``ack``, which the client waits for before it releases the partition's lock, so the next
  reader can never see the old copy.

With ``communication.partition_precision: compressed`` (:mod:`bigembed.communication.row_delta`)
a ``get`` may ask for ``form: bf16`` (the embeddings come as bfloat16; the client remembers
them) and a ``put`` may carry ``form: delta``: the trained embeddings minus what the client
received, int8 per row with a scale per row (sent with the state as one float32 tensor), which
the server adds to the fp32 master it kept; a server that does not hold the partition refuses
a delta (``ready: false``) instead of inventing a base. Checkpoints fetch in fp32 (``exact``).

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

from bigembed.communication import TRANSFER_DTYPE, RowDelta, to_transfer
from bigembed.distributed.auth import Session
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.rpc import BadRequest, Message, RpcClient, RpcServer, field
from bigembed.distributed.store import StoreAddress, store_set
from bigembed.errors import PeerError
from bigembed.kernels import Table
from bigembed.partition_keys import PartitionKey

logger = logging.getLogger(__name__)

MAX_PUT_ELEMENTS = 1 << 36  # 256 GiB of float32: no partition of a real run is larger


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
        trainers: int | None = None,
    ) -> None:
        self.rank = rank
        self.trainers = trainers  # clients are trainer ranks 0..trainers-1 (None: not checked)
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
        """Validate a request (a member trainer, well-formed, sizes bounded), then serve it."""
        op = field(req, "op", str, choices=("stop", "get", "put"))
        if op == "stop":
            threading.Thread(target=self.stop, daemon=True).start()
            return {"ok": True}
        raw_key = field(req, "key", list, max_len=2)
        if len(raw_key) != 2 or not isinstance(raw_key[0], str) or len(raw_key[0]) > 256:
            raise BadRequest(f"bad partition key {str(raw_key)[:80]!r}")
        key = (raw_key[0], field({"part": raw_key[1]}, "part", int, low=0, high=1 << 31))
        client = field(req, "client", int, low=0, high=self.trainers)
        n = field(req, "seq", int, low=1)
        form = req.get("form", "fp32")
        if form not in ("fp32", "bf16", "delta"):
            raise BadRequest(f"bad field 'form': {str(form)[:80]!r}")
        if op == "get":
            with self._lock:
                table = self.tables.get(key)
            if table is None:
                return {"found": False}
            self._pool.submit(self._guard, self._send, table, client, n, form == "bf16")
            return {"found": True, "shape": list(table.emb.shape)}
        if op == "put":
            shape = field(req, "shape", list, max_len=2)
            if len(shape) != 2:
                raise BadRequest(f"bad field 'shape': {str(shape)[:80]!r}")
            rows = field({"rows": shape[0]}, "rows", int, low=1, high=1 << 40)
            dim = field({"dim": shape[1]}, "dim", int, low=1, high=1 << 16)
            if rows * dim > MAX_PUT_ELEMENTS:
                raise BadRequest(f"a put of {rows} x {dim} is larger than any partition may be")
            with self._lock:
                table = self.tables.get(key)
            if form == "delta":
                if table is None or tuple(table.emb.shape) != (rows, dim):
                    return {
                        "ready": False,
                        "reason": f"holds no {rows} x {dim} copy of partition {key[1]} of "
                        f"'{key[0]}' to add a compressed change to",
                    }
                self._pool.submit(self._guard, self._receive_delta, key, table, client, n)
                return {"ready": True}
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

    def _send(self, table: Table, client: int, n: int, compressed: bool = False) -> None:
        emb = to_transfer(table.emb) if compressed else table.emb
        dist.send(emb, dst=client, group=self.group, tag=data_tag(self.rank, n, 0))
        dist.send(table.state, dst=client, group=self.group, tag=data_tag(self.rank, n, 1))
        self.bytes_sent += emb.numel() * emb.element_size() + table.state.numel() * 4

    def _receive_delta(self, key: PartitionKey, table: Table, client: int, n: int) -> None:
        """Add a trainer's compressed change to the master (no other writer meanwhile: the
        trainer holds the partition's lock until the ack)."""
        rows, dim = table.emb.shape
        delta = RowDelta.empty(rows, dim)
        tail = torch.empty(2 * rows)  # the row scales, then the new state
        dist.recv(delta.codes, src=client, group=self.group, tag=data_tag(self.rank, n, 0))
        dist.recv(tail, src=client, group=self.group, tag=data_tag(self.rank, n, 1))
        delta.scales.copy_(tail[:rows])
        with self._lock:
            table.emb.add_(delta.decode())
            table.state.copy_(tail[rows:])
        self.bytes_received += delta.nbytes + rows * 4
        store_set(self._reply_store(), *self.rpc.encode(n, {"ok": True}, suffix="ack"))

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
        compressed: bool = False,
        connect: Callable[[], dist.Store] | None = None,
    ) -> None:
        """``compressed``: ``communication.partition_precision: compressed`` (module docstring);
        ``connect``: opens a store connection for each other thread that calls (the partition
        store's background reader and writer), so their waits never share one connection."""
        self.rank = rank
        self.connect = connect
        self._owner = threading.get_ident()
        self._local = threading.local()
        self._count = threading.Lock()
        self.compressed = compressed
        self.bases: dict[PartitionKey, torch.Tensor] = {}  # bf16 copies received, per partition
        self.session = session
        self.layout = layout
        self.kv = store
        self.timeout = timeout
        self.local = local
        self.group = group
        self.bytes_sent = 0
        self.bytes_received = 0

    def _kv(self) -> dist.Store:
        if self.connect is None or threading.get_ident() == self._owner:
            return self.kv
        store = getattr(self._local, "kv", None)
        if store is None:
            store = self._local.kv = self.connect()
        return store

    def _rpc(self, server: int) -> RpcClient:
        return RpcClient(
            self._kv(), channel_of(server), self.timeout, self.layout.role(server), self.session
        )

    def _counted(self, sent: int = 0, received: int = 0) -> None:
        with self._count:
            self.bytes_sent += sent
            self.bytes_received += received

    def fetch(
        self,
        key: PartitionKey,
        out_emb: torch.Tensor,
        out_state: torch.Tensor,
        exact: bool = False,
    ) -> bool:
        """Read a partition from its server; ``exact``: fp32 even in compressed mode (for
        checkpoints; nothing is remembered then)."""
        server = self.layout.server_for(key)
        if server == self.rank and self.local is not None:
            return self.local.get_local(key, out_emb, out_state)
        compressed = self.compressed and not exact
        rpc = self._rpc(server)
        n = rpc.send(
            {
                "op": "get",
                "key": list(key),
                "client": self.rank,
                "form": "bf16" if compressed else "fp32",
            }
        )
        reply = rpc.receive(n)
        if not reply["found"]:
            return False
        if tuple(reply["shape"]) != tuple(out_emb.shape):
            raise PeerError(
                _shape_message(
                    key, tuple(reply["shape"]), tuple(out_emb.shape), self.layout.role(server)
                )
            )
        emb = torch.empty(out_emb.shape, dtype=TRANSFER_DTYPE) if compressed else out_emb
        try:
            dist.recv(emb, src=server, group=self.group, tag=data_tag(server, n, 0))
            dist.recv(out_state, src=server, group=self.group, tag=data_tag(server, n, 1))
        except RuntimeError as exc:
            raise PeerError(
                f"receiving a partition from {self.layout.role(server)} failed: {exc}"
            ) from None
        if compressed:
            out_emb.copy_(emb)
            self.bases[key] = emb
        self._counted(received=emb.numel() * emb.element_size() + out_state.numel() * 4)
        return True

    def store(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None:
        server = self.layout.server_for(key)
        if server == self.rank and self.local is not None:
            self.local.put_local(key, emb, state)
            return
        base = self.bases.pop(key, None)
        if base is not None and base.shape == emb.shape:
            self._store_delta(server, key, RowDelta.encode(emb - base.float()), state)
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
        self._counted(sent=(emb.numel() + state.numel()) * 4)

    def _store_delta(
        self, server: int, key: PartitionKey, delta: RowDelta, state: torch.Tensor
    ) -> None:
        rpc = self._rpc(server)
        rows, dim = delta.codes.shape
        n = rpc.send(
            {
                "op": "put",
                "key": list(key),
                "client": self.rank,
                "shape": [rows, dim],
                "form": "delta",
            }
        )
        reply = rpc.receive(n)
        if not reply.get("ready"):
            raise PeerError(f"{self.layout.role(server)} {reply.get('reason', 'refused')}")
        tail = torch.cat([delta.scales, state.reshape(-1)])
        try:
            dist.send(delta.codes, dst=server, group=self.group, tag=data_tag(server, n, 0))
            dist.send(tail, dst=server, group=self.group, tag=data_tag(server, n, 1))
        except RuntimeError as exc:
            raise PeerError(
                f"sending a partition to {self.layout.role(server)} failed: {exc}"
            ) from None
        rpc.receive(n, suffix="ack")
        self._counted(sent=delta.nbytes + rows * 4)

    def stop_server(self, server: int) -> None:
        self._rpc(server).call({"op": "stop"})
