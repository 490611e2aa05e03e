"""The row tables' part of ``async_ps``: row-range shards, row-sparse pushes and pulls.

Every trainer serves a range of rows of every row table (:func:`shard_bounds`: the rows split
evenly over the trainers, in rank order) and its row state (:class:`RowShard`); its row sharer
(:class:`RowSharer`) runs its own loop beside the dense sharer's.

* A push carries, per table, the rows this trainer changed since its last round (or whose
  residual is pending: per-row error feedback, see :mod:`~bigembed.communication.sparse_rows`):
  their indices, ``Q(snapshot - last + residual)`` and their exact state change. The server
  adds them (state clamped at 0) and marks the rows *dirty* for every client.
* The reply carries the rows dirty for that client: those changed on the server (by anybody,
  this push included) since its previous reply to it. Why these rather than rows the client
  asks for: the server knows exactly what changed since it last answered each client, the
  client does not, so this is the smallest reply that keeps the client's copy complete, and it
  costs no request. With ``fp32`` the reply is the rows' value; with a lossy codec it is their
  change since the previous reply to that client, ``Q(value - replied)``, and a row whose
  unsent difference exceeds the dead band stays dirty (the server's error feedback, CHOCO
  form). The state travels as its exact value.

The client then adds ``new last - snapshot`` to its live rows (its own pushed rows'
snapshot; other rows were equal to ``last`` when it looked), so whatever the workers changed
meanwhile is kept for the next push. A trainer's own shard is reached without the network,
exactly. Wire per message: a header of int64 (operation, row count per table), then the rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.sparse_rows import (
    DEAD_BAND,
    RowCodec,
    RowTable,
    joined,
    message_bytes,
    split_message,
)

TAG_PUSH_HEAD, TAG_PUSH, TAG_REPLY_HEAD, TAG_REPLY = 61, 62, 63, 64
OP_PUSH, OP_BYE = 1, 2

Rows = tuple[Tensor, Tensor, Tensor]  # global row indices, values, state


def shard_bounds(rows: int, servers: Sequence[int]) -> list[int]:
    """Row ``servers[k]`` serves ``[bounds[k], bounds[k + 1])`` of a table of ``rows`` rows."""
    n = len(servers)
    return [rows * k // n for k in range(n + 1)]


class RowShard:
    """This trainer's rows of every row table, served to every other trainer's row sharer."""

    def __init__(
        self,
        rank: int,
        servers: Sequence[int],
        tables: Sequence[RowTable],
        tensors: Sequence[Tensor],
        codecs: Sequence[RowCodec],
        group: dist.ProcessGroup | None,
        on_error: Callable[[str], None],
    ) -> None:
        self.rank = rank
        self.group = group
        self.on_error = on_error
        self.codecs = codecs
        k = list(servers).index(rank)
        self.lo = [shard_bounds(t.rows, servers)[k] for t in tables]
        hi = [shard_bounds(t.rows, servers)[k + 1] for t in tables]
        self.value = [
            (tensors[t.table].data[a:b].clone(), tensors[t.state].data[a:b].clone())
            for t, a, b in zip(tables, self.lo, hi, strict=True)
        ]
        self.dirty = {
            c: [torch.zeros(b - a, dtype=torch.bool) for a, b in zip(self.lo, hi, strict=True)]
            for c in servers
        }
        lossy = not codecs[0].lossless if codecs else False
        self.replied = {
            c: [v.clone() for v, _ in self.value] for c in servers if c != rank and lossy
        }
        self._lock = threading.Lock()
        serves = any(b > a for a, b in zip(self.lo, hi, strict=True))
        self._threads = [
            threading.Thread(target=self._serve, args=(c,), name=f"bigembed-rows-{c}", daemon=True)
            for c in servers
            if c != rank and serves
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout=timeout)

    def push_pull(
        self, client: int, pushed: Sequence[Rows], wire: bool
    ) -> list[tuple[Rows, Tensor]]:
        """Add a client's rows; returns, per table, the rows dirty for it and (``wire``: a
        remote client) the message that carries them: their values, or with a lossy codec
        their changes since the previous reply (the rows then hold what the message decodes
        to)."""
        with self._lock:
            for k, (idx, values, changes) in enumerate(pushed):
                at = idx - self.lo[k]
                table, state = self.value[k]
                table.index_add_(0, at, values)
                state.index_add_(0, at, changes)
                state[at] = state[at].clamp_min(0)
                for dirty in self.dirty.values():
                    dirty[k][at] = True
            return [self._reply(client, k, wire) for k in range(len(self.value))]

    def _reply(self, client: int, k: int, wire: bool) -> tuple[Rows, Tensor]:
        dirty = self.dirty[client][k]
        at = dirty.nonzero().view(-1)
        rows = at + self.lo[k]
        table, state = self.value[k]
        values, now = table[at], state[at]
        dirty[at] = False
        codec = self.codecs[k]
        if not wire:
            return (rows, values, now), torch.empty(0, dtype=torch.uint8)
        if codec.lossless:
            return (rows, values, now), codec.encode(rows, values, now)[0]
        replied = self.replied[client][k]
        message, decoded = codec.encode(rows, values - replied[at], now)
        replied.index_add_(0, at, decoded)
        left = (values - replied[at]).abs().amax(dim=1)
        dirty[at] = left > DEAD_BAND * values.abs().amax(dim=1)
        return (rows, decoded, now), message

    def _serve(self, client: int) -> None:
        head = torch.zeros(1 + len(self.codecs), dtype=torch.int64)
        try:
            while True:
                dist.recv(head, src=client, group=self.group, tag=TAG_PUSH_HEAD)
                if int(head[0]) == OP_BYE:
                    return
                counts = head[1:].tolist()
                buf = torch.empty(message_bytes(counts, self.codecs), dtype=torch.uint8)
                if buf.numel():
                    dist.recv(buf, src=client, group=self.group, tag=TAG_PUSH)
                parts = split_message(buf, counts, self.codecs)
                pushed = [c.decode(p) for c, p in zip(self.codecs, parts, strict=True)]
                reply = self.push_pull(client, pushed, wire=True)
                messages = [message for _, message in reply]
                counts_out = torch.tensor([r[0].numel() for r, _ in reply], dtype=torch.int64)
                dist.send(counts_out, dst=client, group=self.group, tag=TAG_REPLY_HEAD)
                payload = joined(messages)
                if payload.numel():
                    dist.send(payload, dst=client, group=self.group, tag=TAG_REPLY)
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"row server on rank {self.rank} lost trainer {client}: {exc}")
