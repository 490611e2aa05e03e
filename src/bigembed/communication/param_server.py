"""Parameter servers: every trainer hosts one shard of the shared parameters.

Shared parameters are the ones every bucket touches: relation operators, global embeddings,
unpartitioned entity embeddings, and (unlike PBG, which leaves them unshared) their Adagrad
accumulators, which are sums and merge exactly the same way. :class:`ShardPlan` cuts them into
segments: a tensor over 10 MB is split evenly over all servers, a smaller one lives whole on
the server its name hashes to. A server's shard is one flat float32 vector.

Each server runs a thread per remote client (its sharer loop, see
:mod:`bigembed.communication.sharer`) that repeatedly receives a header and a delta, adds the
delta to the shard and sends the merged value back, over the trainers' gloo group. With a lossy
``communication.precision`` the delta arrives encoded segment by segment
(:class:`~bigembed.communication.segment_stream.SegmentStream`), and the reply is the value's
change since the previous reply to that client, encoded the same way with a per-client error
feedback (see the sharer). The client sends continuously (at least a few rounds per second), so
gloo's timeout on these receives really means a dead peer.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication import Codec, get_codec, wire_bytes
from bigembed.communication.segment_stream import SegmentStream

SPLIT_BYTES = 10 * 2**20
TAG_HEADER, TAG_DELTA, TAG_VALUE = 11, 12, 13
OP_PUSH_PULL, OP_BYE = 1, 2


@dataclass(frozen=True)
class Segment:
    """Elements ``[start, end)`` of shared tensor ``tensor`` (flattened)."""

    tensor: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class ShardPlan:
    """Which server holds which piece of which shared tensor (the same on every rank)."""

    def __init__(
        self,
        names: Sequence[str],
        numels: Sequence[int],
        servers: Sequence[int],
        nonnegative: Collection[int] = (),
    ) -> None:
        """``nonnegative``: indices of the tensors that must stay >= 0 where they are used
        (Adagrad accumulators: a lossy exchange may bring one near 0 slightly below it)."""
        self.names = list(names)
        self.nonnegative = frozenset(nonnegative)
        self.servers = list(servers)
        self.segments: dict[int, list[Segment]] = {s: [] for s in servers}
        n = len(servers)
        for idx, (name, numel) in enumerate(zip(names, numels, strict=True)):
            if numel == 0:
                continue
            if numel * 4 > SPLIT_BYTES and n > 1:
                bounds = [numel * k // n for k in range(n + 1)]
                for k, server in enumerate(servers):
                    if bounds[k + 1] > bounds[k]:
                        self.segments[server].append(Segment(idx, bounds[k], bounds[k + 1]))
            else:
                server = servers[zlib.crc32(name.encode()) % n]
                self.segments[server].append(Segment(idx, 0, numel))

    def size(self, server: int) -> int:
        return sum(s.size for s in self.segments[server])

    @property
    def active_servers(self) -> list[int]:
        return [s for s in self.servers if self.size(s) > 0]


def gather(flat: Sequence[Tensor], segments: Sequence[Segment]) -> Tensor:
    """Copy the segments' current values into one new flat vector."""
    if not segments:
        return torch.empty(0)
    return torch.cat([flat[s.tensor][s.start : s.end] for s in segments])


def scatter_add(flat: Sequence[Tensor], segments: Sequence[Segment], values: Tensor) -> None:
    offset = 0
    for s in segments:
        flat[s.tensor][s.start : s.end].add_(values[offset : offset + s.size])
        offset += s.size


def scatter_copy(flat: Sequence[Tensor], segments: Sequence[Segment], values: Tensor) -> None:
    """Set the segments to ``values`` (bit for bit; ``scatter_add`` of a difference may round)."""
    offset = 0
    for s in segments:
        flat[s.tensor][s.start : s.end].copy_(values[offset : offset + s.size])
        offset += s.size


class ParameterServer:
    """One shard of the shared parameters, served to every other trainer's sharer."""

    def __init__(
        self,
        rank: int,
        initial: Tensor,
        clients: Sequence[int],
        group: dist.ProcessGroup | None,
        on_error: Callable[[str], None],
        codec: Codec | None = None,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """``sizes``: the shard's segment sizes (``ShardPlan.segments[rank]``), which a lossy
        codec encodes one by one, as the clients do; required with a lossy codec."""
        self.rank = rank
        self.value = initial.clone()
        self.codec = codec or get_codec("fp32")
        if sizes is None and not self.codec.lossless:
            raise ValueError(f"{self.codec.name}: the server needs its segment sizes")
        self.sizes = list(sizes) if sizes is not None else [self.value.numel()]
        if sum(self.sizes) != self.value.numel():
            raise ValueError(f"segment sizes {self.sizes} do not add up to {self.value.numel()}")
        self.bytes_sent = 0
        self.bytes_received = 0
        # the value as of the previous reply to each client (lossy codecs reply with changes);
        # taken now, before the local sharer can push, so that it matches the client's copy
        lossy = not self.codec.lossless
        self._replied = {c: self.value.clone() for c in clients if c != rank and lossy}
        self.group = group
        self.on_error = on_error
        self._lock = threading.Lock()
        self.rounds = 0
        self._threads = (
            [
                threading.Thread(
                    target=self._serve, args=(c,), name=f"bigembed-ps-{c}", daemon=True
                )
                for c in clients
                if c != rank
            ]
            if self.value.numel() > 0
            else []
        )

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout=timeout)

    def push_pull(self, delta: Tensor) -> Tensor:
        """Add a client's delta; returns the merged value (a copy)."""
        with self._lock:
            self.value.add_(delta)
            self.rounds += 1
            return self.value.clone()

    def _serve(self, client: int) -> None:
        if self.codec.lossless:
            self._serve_exact(client)
        else:
            self._serve_lossy(client)

    def _serve_exact(self, client: int) -> None:
        header = torch.zeros(2, dtype=torch.int64)
        message = self.codec.empty(self.value.numel())
        try:
            while True:
                dist.recv(header, src=client, group=self.group, tag=TAG_HEADER)
                if int(header[0]) == OP_BYE:
                    return
                dist.recv(message.wire(), src=client, group=self.group, tag=TAG_DELTA)
                reply = self.codec.encode(self.push_pull(self.codec.decode(message)))
                dist.send(reply.wire(), dst=client, group=self.group, tag=TAG_VALUE)
                with self._lock:
                    self.bytes_received += wire_bytes(message)
                    self.bytes_sent += wire_bytes(reply)
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"parameter server on rank {self.rank} lost trainer {client}: {exc}")

    def _serve_lossy(self, client: int) -> None:
        header = torch.zeros(2, dtype=torch.int64)
        inbox = SegmentStream(self.codec, self.sizes)  # decodes the client's deltas
        outbox = SegmentStream(self.codec, self.sizes)  # encodes the replies (error feedback)
        message = inbox.empty()
        replied = self._replied.pop(client)
        try:
            while True:
                dist.recv(header, src=client, group=self.group, tag=TAG_HEADER)
                if int(header[0]) == OP_BYE:
                    return
                dist.recv(message, src=client, group=self.group, tag=TAG_DELTA)
                merged = self.push_pull(inbox.decode(message))
                reply = outbox.encode(merged - replied)
                replied = merged
                dist.send(reply, dst=client, group=self.group, tag=TAG_VALUE)
                with self._lock:
                    self.bytes_received += message.numel()
                    self.bytes_sent += reply.numel()
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"parameter server on rank {self.rank} lost trainer {client}: {exc}")
