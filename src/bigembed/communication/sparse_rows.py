"""Row-sparse embedding deltas: which rows changed, their wire format, and error feedback.

An entity table of ``(rows, dim)`` changes only in the rows the round's batches touched. With
``communication.sparse_rows`` the strategies send such a table (a ``SharedTensors.row_tables``
entry) as the changed rows only: their indices, their values in the codec's precision and their
row-Adagrad state, one float per row. The other shared tensors keep the dense path.

Wire format of one table's message of ``k`` rows (:class:`RowCodec`), sections in this order:

* ``k`` int32 row indices;
* ``k`` float32 state values (exact at every precision: an Adagrad accumulator near 0 must not
  go negative, and it is 4 bytes per row against ``dim`` values);
* int8 only: ``k`` float32 per-row scales;
* the ``k x dim`` values: float32, float16 or bfloat16 casts (the codecs of
  :mod:`~bigembed.communication.codecs`, with their range checks), or int8 codes
  ``round(x / scale)`` with ``scale = max|row| / 127`` (symmetric per row, as
  :class:`~bigembed.communication.row_delta.RowDelta`): error <= ``scale / 2`` per value.

So a row costs ``8 + 4 dim`` bytes in fp32, ``8 + 2 dim`` in fp16/bf16 and ``12 + dim`` in
int8; a message's length gives ``k``. Several tables travel as one buffer after a header of
their row counts (int64), which every byte count includes.

Error feedback (:class:`RowFeedback`): a lossy sender keeps per row what quantization dropped
(the residual, a dense ``(rows, dim)`` tensor) and adds it to the row's next message. A row
whose residual matters is *pending* and goes out in the next round even if training did not
touch it again. It matters when it exceeds a dead band of ``DEAD_BAND`` times the row's largest
magnitude: a residual below that (a few float32 ulps of the row) waits, kept, until the row
changes again, instead of resending every touched row in every later round while its residual
shrinks geometrically towards 0 (about 18 rounds at int8), which would cost more bytes than the
sparsity saves. The value every trainer holds thus differs from the exact sum by at most one
message's error plus that dead band, whatever the number of rounds; without the residual the
error would grow with every round (a bias of the same sign for the same change).

Row selection (``communication.row_fraction`` < 1, Deep Gradient Compression's top-k applied to
rows): a data round sends at most :func:`row_limit` rows of a table, the ones whose change plus
residual is largest (L2 norm, :func:`largest_rows`). An unsent row's change is not lost, only
delayed: the strategies measure a row's change against the value the others already hold of it
(``last``, ``known_by``), which an unsent row does not move, so the change stays in ``live -
last`` and goes out, grown by whatever the workers add, in a later round; its quantization
residual stays in :class:`RowFeedback` meanwhile. The local replica trains on its own unsent
changes at once. A round that must leave the trainers agreeing (a checkpoint's agreement, an
``async_ps`` flush) sends every changed row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec, NonFiniteError
from bigembed.communication.primitives import exchange

DEAD_BAND = 2.0**-16
_LEVELS = 127
_CHUNK_ROWS = 1 << 16  # rows compared at a time (bounds the temporary masks)


@dataclass(frozen=True)
class RowTable:
    """One row-sparse table: indices of the table and its row state among the shared tensors."""

    table: int
    state: int
    rows: int
    dim: int


def row_tables(tensors: Sequence[Tensor], tables: Mapping[int, int]) -> list[RowTable]:
    """The row tables of a ``SharedTensors``, in table order (the same on every trainer)."""
    found = []
    for t, s in sorted(tables.items()):
        table, state = tensors[t], tensors[s]
        if table.dim() != 2 or state.shape != (table.shape[0],):
            raise ValueError(
                f"row table {t}: shape {tuple(table.shape)} with state {tuple(state.shape)} "
                "(need (rows, dim) and (rows,))"
            )
        if table.shape[0] >= 2**31:
            raise ValueError(f"row table {t}: {table.shape[0]} rows do not fit int32 indices")
        found.append(RowTable(t, s, table.shape[0], table.shape[1]))
    return found


def row_tensors(tables: Mapping[int, int]) -> frozenset[int]:
    """The indices of the tensors the row path carries (tables and their states)."""
    return frozenset(tables) | frozenset(tables.values())


def _check_finite(x: Tensor, what: str) -> None:
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise NonFiniteError(
            f"{what}: the rows to send hold NaN/inf values (the model diverged? try a lower lr)"
        )


class RowCodec:
    """Encodes and decodes one table's changed rows (see the module docstring for the layout)."""

    def __init__(self, codec: Codec, dim: int) -> None:
        self.codec = codec
        self.dim = dim
        self.int8 = codec.name == "int8"
        if self.int8:
            self.value_bytes = dim + 4  # codes and the row's scale
        else:
            self.value_bytes = dim * codec.empty(1).data.element_size()
        self.row_bytes = 8 + self.value_bytes

    @property
    def lossless(self) -> bool:
        return self.codec.lossless

    def nbytes(self, count: int) -> int:
        return count * self.row_bytes

    def encode(self, idx: Tensor, values: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """The message of rows ``idx`` (their ``values`` and ``state``), and the values it
        decodes to."""
        k = idx.numel()
        out = torch.empty(self.nbytes(k), dtype=torch.uint8)
        out[: 4 * k].view(torch.int32).copy_(idx)
        if not self.lossless:  # fp32 passes non-finite values through, as its codec does
            _check_finite(state, f"{self.codec.name} rows")
        out[4 * k : 8 * k].view(torch.float32).copy_(state)
        if self.int8:
            peak = values.abs().amax(dim=1) if self.dim else torch.zeros(k)
            _check_finite(peak, "int8 rows")  # a row's peak is NaN/inf iff one of its values is
            scales = peak / _LEVELS
            safe = torch.where(scales > 0, scales, torch.ones_like(scales))
            # |value / scale| <= 127 by the choice of scale: no clamp needed
            levels = torch.div(values, safe[:, None]).round_()
            out[8 * k : 12 * k].view(torch.float32).copy_(scales)
            out[12 * k :].view(torch.int8).view(k, self.dim).copy_(levels)  # exact: integers
            return out, levels.mul_(scales[:, None])
        if self.lossless:  # the values themselves: one copy, no intermediate
            out[8 * k :].view(torch.float32).view(k, self.dim).copy_(values)
            return out, values
        encoded = self.codec.encode(values)
        out[8 * k :].copy_(encoded.data.reshape(-1).view(torch.uint8))
        return out, self.codec.decode(encoded).reshape(k, self.dim)

    def decode(self, buf: Tensor, copy: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """``(indices (int64), values (k x dim), state (k))`` of a message. ``copy`` False: the
        values may be a view of ``buf`` (fp32), for a caller that only reads them."""
        if buf.storage_offset() % 4:  # a later table of a message: realign for the views
            buf = buf.clone()
        k = buf.numel() // self.row_bytes
        idx = buf[: 4 * k].view(torch.int32).to(torch.int64)
        state = buf[4 * k : 8 * k].view(torch.float32).clone()
        if self.int8:
            scales = buf[8 * k : 12 * k].view(torch.float32)
            codes = buf[12 * k :].view(torch.int8).view(k, self.dim)
            return idx, codes.to(torch.float32) * scales[:, None], state
        if self.lossless:
            values = buf[8 * k :].view(torch.float32).view(k, self.dim)
            return idx, values.clone() if copy else values, state
        encoded = self.codec.empty(k * self.dim, (k, self.dim))
        encoded.data.view(torch.uint8).copy_(buf[8 * k :])
        return idx, self.codec.decode(encoded).reshape(k, self.dim), state


class RowFeedback:
    """A sender's per-row error feedback for one table (nothing to keep for a lossless codec).

    ``pending``: the rows whose residual exceeds the dead band, which the next round sends."""

    def __init__(self, codec: RowCodec, rows: int) -> None:
        self.codec = codec
        self.residual = None if codec.lossless else torch.zeros(rows, codec.dim)
        self.pending = None if codec.lossless else torch.zeros(rows, dtype=torch.bool)

    def choose(self, idx: Tensor, delta: Tensor, limit: int) -> Tensor:
        """Positions of the rows (``idx``, their changes ``delta``) a round sends: the
        ``limit`` largest changes plus residuals (see :func:`largest_rows`)."""
        if idx.numel() <= limit:
            return torch.arange(idx.numel())
        target = delta if self.residual is None else delta + self.residual[idx]
        return largest_rows(target, limit)

    def encode(
        self, idx: Tensor, delta: Tensor, state: Tensor, values: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The message of ``delta`` (rows ``idx``) plus their residuals, and what it decodes
        to; ``values``: the rows' current values, which set the dead band."""
        if self.residual is None or self.pending is None:
            return self.codec.encode(idx, delta, state)
        target = self.residual.index_select(0, idx).add_(delta)
        message, decoded = self.codec.encode(idx, target, state)
        left = target.sub_(decoded)
        self.residual.index_copy_(0, idx, left)
        self.pending[idx] = left.abs_().amax(dim=1) > DEAD_BAND * values.abs().amax(dim=1)
        return message, decoded


def row_limit(fraction: float, rows: int) -> int:
    """The most rows of a table of ``rows`` rows a round sends at ``row_fraction``."""
    return rows if fraction >= 1 else max(1, math.ceil(fraction * rows))


def largest_rows(target: Tensor, limit: int) -> Tensor:
    """Sorted positions of the ``limit`` rows of ``target`` with the largest L2 norm (every
    position when there are no more rows than that)."""
    if target.shape[0] <= limit:
        return torch.arange(target.shape[0])
    score = target.square().sum(dim=1)
    return torch.topk(score, limit, sorted=False).indices.sort().values


def changed_rows(
    live: Tensor,
    ref: Tensor,
    state: Tensor,
    ref_state: Tensor,
    pending: Tensor | None = None,
    band: float = 0.0,
    symmetric: bool = False,
) -> Tensor:
    """Sorted indices of the rows where ``live`` differs from ``ref`` (by more than ``band``
    times the row's largest magnitude in ``live``, or with ``symmetric`` in either, when
    ``band`` > 0) or ``state`` from ``ref_state``, or that are ``pending``. Compared a chunk of
    rows at a time: no full-size temporary."""
    mask = state != ref_state
    if pending is not None:
        mask |= pending
    for start in range(0, live.shape[0], _CHUNK_ROWS):
        a, b = live[start : start + _CHUNK_ROWS], ref[start : start + _CHUNK_ROWS]
        # the largest |a - b| of each row; a NaN propagates, so such a row counts as changed
        far = torch.sub(a, b).abs_().amax(dim=1)
        if band > 0:
            scale = a.abs().amax(dim=1)
            if symmetric:
                scale = torch.maximum(scale, b.abs().amax(dim=1))
            diff = far > scale.mul_(band)
        else:  # a != b for some value (equal infinities count too: resent, harmless)
            diff = far != 0
        mask[start : start + _CHUNK_ROWS] |= diff
    return mask.nonzero().view(-1)


def split_message(buf: Tensor, counts: Sequence[int], codecs: Sequence[RowCodec]) -> list[Tensor]:
    """The per-table parts of a buffer that carries ``counts[t]`` rows of table ``t``."""
    parts, offset = [], 0
    for k, codec in zip(counts, codecs, strict=True):
        size = codec.nbytes(k)
        parts.append(buf[offset : offset + size])
        offset += size
    return parts


def joined(messages: Sequence[Tensor]) -> Tensor:
    """The tables' messages as one buffer (a lone message as it is: no copy)."""
    return messages[0] if len(messages) == 1 else torch.cat(list(messages))


def union_rows(rows: int, indices: Sequence[Tensor]) -> Tensor:
    """The sorted distinct indices of ``indices`` (each into a table of ``rows`` rows): a
    mask, not a sort."""
    mask = torch.zeros(rows, dtype=torch.bool)
    for idx in indices:
        mask.index_fill_(0, idx, True)
    return mask.nonzero().view(-1)


def message_bytes(counts: Sequence[int], codecs: Sequence[RowCodec]) -> int:
    return sum(c.nbytes(k) for k, c in zip(counts, codecs, strict=True))


def exchange_rows(
    counts: Tensor,
    payload: Tensor,
    peers: Sequence[int],
    codecs: Sequence[RowCodec],
    group: dist.ProcessGroup | None,
    tags: tuple[int, int],
) -> tuple[dict[int, tuple[list[int], Tensor]], int, int]:
    """Send this trainer's row counts (int64 per table) and message to every peer, receive
    theirs: ``({peer: (counts, message)}, bytes sent, bytes received)``. An empty message is
    not sent (both sides know it from the counts)."""
    got = {p: torch.empty_like(counts) for p in peers}
    exchange(dict.fromkeys(peers, counts), got, group, tags[0])
    sizes = {p: message_bytes(got[p].tolist(), codecs) for p in peers}
    inbox = {p: torch.empty(sizes[p], dtype=torch.uint8) for p in peers if sizes[p]}
    sends = dict.fromkeys(peers, payload) if payload.numel() else {}
    exchange(sends, inbox, group, tags[1])
    head = counts.numel() * counts.element_size() * len(peers)
    sent = head + payload.numel() * len(sends)
    received = head + sum(sizes.values())
    empty = torch.empty(0, dtype=torch.uint8)
    return {p: (got[p].tolist(), inbox.get(p, empty)) for p in peers}, sent, received
