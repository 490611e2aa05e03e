"""The row tables' part of a collective round: a sparse all-gather, then everybody sums.

Each trainer sends every other trainer the same message: per row table, the rows that changed
since the last round (or whose residual is pending, see
:mod:`~bigembed.communication.sparse_rows`), as ``Q(snapshot - last + residual)`` and their
state's change. Each trainer then decodes all messages, its own included, from their bytes and
adds them in rank order over the union of the rows: every trainer computes the same sum from
the same bytes, so all end the round with bit-identical rows, whatever the codec (as the dense
:class:`~bigembed.communication.primitives.ShardedReduce` guarantees). ``mean`` divides the
sum by the number of trainers (``async_model_average``); the merged state is clamped at 0 on
every trainer alike.

``last`` is the agreed value of every row; a row nobody sent keeps it on every trainer. Rows
this trainer did not send were equal to ``last`` when it looked, or hold a change it kept back
(``fraction`` < 1: only the largest changes go out, see
:mod:`~bigembed.communication.sparse_rows`), so the round adds ``merged - last`` to them, and
``merged - snapshot`` to its own: what the workers changed since, and what was kept back, stays
in ``live - last`` for a later round. An assigning round sends every changed row.

Bytes per trainer and round: ``(W - 1)`` times its message, plus the row counts (an all-gather,
against ``2 (W - 1) / W`` times the dense table for the dense allreduce): cheaper whenever a
round changes fewer than about ``2 / W`` of the rows (times the codec's ratio of row bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec
from bigembed.communication.sparse_rows import (
    RowCodec,
    RowFeedback,
    changed_rows,
    exchange_rows,
    joined,
    row_limit,
    row_tables,
    split_message,
    union_rows,
)

TAG_ROW_COUNTS, TAG_ROW_DATA = 71, 72


class RowReduce:
    """One trainer's row tables in the collective strategies (one instance per strategy)."""

    def __init__(
        self,
        rank: int,
        trainers: Sequence[int],
        group: dist.ProcessGroup | None,
        codec: Codec,
        tensors: Sequence[Tensor],
        tables: Mapping[int, int],
        *,
        mean: bool,
        fraction: float = 1.0,
    ) -> None:
        self.rank = rank
        self.ranks = sorted(trainers)
        self.peers = [t for t in self.ranks if t != rank]
        self.group = group
        self.mean = mean
        self.tables = row_tables(tensors, tables)
        self.live = [(tensors[t.table].data, tensors[t.state].data) for t in self.tables]
        self.last = [(a.clone(), s.clone()) for a, s in self.live]
        self.codecs = [RowCodec(codec, t.dim) for t in self.tables]
        self.feedback = [
            RowFeedback(c, t.rows) for c, t in zip(self.codecs, self.tables, strict=True)
        ]
        self.limits = [row_limit(fraction, t.rows) for t in self.tables]
        self.bytes_sent = 0
        self.bytes_received = 0

    def round(self, assign: bool, snapped: Callable[[], None] | None = None) -> None:
        """One round. ``assign`` (no worker trains: an agreement): set the rows to the merged
        values, bit for bit, instead of adding the change. ``snapped``: called once the changed
        rows are read (an overlapped round opens the gate then)."""
        if not self.tables:
            if snapped is not None:
                snapped()
            return
        mine = []
        for (live, state), (last, last_state), fb, limit in zip(
            self.live, self.last, self.feedback, self.limits, strict=True
        ):
            idx = changed_rows(live, last, state, last_state, fb.pending)
            snap, snap_state = live.index_select(0, idx), state.index_select(0, idx)
            delta = snap - last.index_select(0, idx)
            if not assign:  # an agreement sends every changed row (row_fraction)
                keep = fb.choose(idx, delta, limit)
                if keep.numel() < idx.numel():
                    idx, snap, snap_state, delta = (
                        x.index_select(0, keep) for x in (idx, snap, snap_state, delta)
                    )
            delta_state = snap_state - last_state.index_select(0, idx)
            message, _ = fb.encode(idx, delta, delta_state, snap)
            mine.append((idx, snap, snap_state, message))
        if snapped is not None:
            snapped()
        counts = torch.tensor([m[0].numel() for m in mine], dtype=torch.int64)
        payload = joined([m[3] for m in mine])
        got, sent, received = exchange_rows(
            counts, payload, self.peers, self.codecs, self.group, (TAG_ROW_COUNTS, TAG_ROW_DATA)
        )
        self.bytes_sent += sent
        self.bytes_received += received
        got[self.rank] = (counts.tolist(), payload)
        parts = {r: split_message(got[r][1], got[r][0], self.codecs) for r in self.ranks}
        for k, codec in enumerate(self.codecs):
            decoded = [codec.decode(parts[r][k], copy=False) for r in self.ranks]
            self._apply(k, decoded, mine[k], assign)

    def _apply(
        self,
        k: int,
        decoded: list[tuple[Tensor, Tensor, Tensor]],
        mine: tuple[Tensor, Tensor, Tensor, Tensor],
        assign: bool,
    ) -> None:
        live, state = self.live[k]
        last, last_state = self.last[k]
        rows = union_rows(live.shape[0], [d[0] for d in decoded])  # sorted
        if rows.numel() == 0:
            return
        every_row = rows.numel() == live.shape[0]  # rows is then arange: no gathers needed
        total = torch.zeros(rows.numel(), self.tables[k].dim)
        total_state = torch.zeros(rows.numel())
        for idx, values, changes in decoded:  # rank order: the same sum on every trainer
            at = idx if every_row else torch.searchsorted(rows, idx)
            total.index_add_(0, at, values)  # a message holds a row once: no repeated index
            total_state.index_add_(0, at, changes)
        if self.mean:
            total /= len(self.ranks)
            total_state /= len(self.ranks)
        merged = total.add_(last if every_row else last.index_select(0, rows))
        merged_state = total_state.add_(
            last_state if every_row else last_state.index_select(0, rows)
        )
        merged_state.clamp_min_(0)
        if assign:
            live.index_copy_(0, rows, merged)
            state.index_copy_(0, rows, merged_state)
        else:
            # what the round adds to a row: ``merged - snapshot`` for the rows this trainer
            # sent (their snapshot), ``merged - last`` for the others (they equalled ``last``)
            snap = last.clone() if every_row else last.index_select(0, rows)
            snap_state = last_state.clone() if every_row else last_state.index_select(0, rows)
            at = mine[0] if every_row else torch.searchsorted(rows, mine[0])
            snap.index_copy_(0, at, mine[1])
            snap_state.index_copy_(0, at, mine[2])
            live.index_add_(0, rows, snap.neg_().add_(merged))
            state.index_add_(0, rows, snap_state.neg_().add_(merged_state))
        last.index_copy_(0, rows, merged)
        last_state.index_copy_(0, rows, merged_state)
