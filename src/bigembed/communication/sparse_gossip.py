"""The row tables' part of a ``decentralized`` round: the CHOCO pair exchange, row-sparse.

Per peer a trainer keeps, per row table, ``known_by`` (the peer's copy of this trainer's rows
and row state) and ``estimate`` (its copy of the peer's). A pair round sends the rows where
the live table differs from ``known_by`` (with a lossy codec: by more than
:data:`~bigembed.communication.sparse_rows.DEAD_BAND` times the row's largest magnitude), as
``Q(value - known_by)`` plus the exact state difference; both sides add the decoded message to
their copy, so the copies stay equal bit for bit, and what quantization dropped is still in the
next difference (error feedback without a separate residual; a difference inside the dead band
waits until it grows). Then each side moves its rows halfway from its public copy to the
peer's, CHOCO's step: ``live += (estimate - known_by) / 2`` (state too, clamped at 0), on the
rows where the two public copies differ (beyond the dead band). The two moves are opposite bit
for bit, so gossip keeps the trainers' sum exactly, whatever the codec; the dense path's
``(snapshot + estimate) / 2`` differs from it by the last message's quantization error.

With ``fraction`` < 1 a pair round sends only the rows with the largest differences (at most
:func:`~bigembed.communication.sparse_rows.row_limit` rows); the others' differences stay and
go out in a later round. The public copies then lag the values by more than a quantization
error, and CHOCO's step shrinks with the compression, as its analysis asks (a step of the order
of the compression ratio): ``min(1/2, fraction)`` instead of ``1/2``. With the halfway step and
a small fraction the trainers stop converging: each move adds to the difference the copy has
not caught up with, faster than the limited rows drain it.

The agreement at a checkpoint is a row-sparse exact mean
(:class:`~bigembed.communication.sparse_reduce.RowReduce` in fp32 with ``mean``, over the
rows changed since the previous agreement): every trainer ends with the same bits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec, get_codec
from bigembed.communication.sparse_reduce import RowReduce
from bigembed.communication.sparse_rows import (
    DEAD_BAND,
    RowCodec,
    changed_rows,
    exchange_rows,
    joined,
    largest_rows,
    row_limit,
    row_tables,
    split_message,
)

TAG_PAIR_COUNTS, TAG_PAIR_ROWS = 73, 74

_Copy = list[tuple[Tensor, Tensor]]  # per table: (rows, state)


class RowGossip:
    """One trainer's row tables in ``decentralized`` (one instance per strategy)."""

    def __init__(
        self,
        rank: int,
        trainers: Sequence[int],
        group: dist.ProcessGroup | None,
        codec: Codec,
        tensors: Sequence[Tensor],
        tables: Mapping[int, int],
        fraction: float = 1.0,
    ) -> None:
        self.group = group
        self.tables = row_tables(tensors, tables)
        self.limits = [row_limit(fraction, t.rows) for t in self.tables]
        self.live = [(tensors[t.table].data, tensors[t.state].data) for t in self.tables]
        # every trainer starts from rank 0's values: the copies of each other start equal
        self.initial = [(a.clone(), s.clone()) for a, s in self.live]
        self.codecs = [RowCodec(codec, t.dim) for t in self.tables]
        self.band = 0.0 if codec.lossless else DEAD_BAND
        self.step = min(0.5, fraction)  # CHOCO's consensus step (see the module docstring)
        self.known_by: dict[int, _Copy] = {}
        self.estimate: dict[int, _Copy] = {}
        self.agreement = RowReduce(
            rank, trainers, group, get_codec("fp32"), tensors, tables, mean=True
        )
        self.pair_sent = 0
        self.pair_received = 0

    @property
    def bytes_sent(self) -> int:
        return self.pair_sent + self.agreement.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.pair_received + self.agreement.bytes_received

    def _copies(self, peer: int) -> tuple[_Copy, _Copy]:
        if peer not in self.known_by:
            self.known_by[peer] = [(a.clone(), s.clone()) for a, s in self.initial]
            self.estimate[peer] = [(a.clone(), s.clone()) for a, s in self.initial]
        return self.known_by[peer], self.estimate[peer]

    def pair_round(self, peer: int) -> None:
        """Exchange with ``peer`` and average with it (it runs the same round)."""
        if not self.tables:
            return
        known_by, estimate = self._copies(peer)
        messages, counts = [], []
        for (live, state), (known, known_state), codec, limit in zip(
            self.live, known_by, self.codecs, self.limits, strict=True
        ):
            send = changed_rows(live, known, state, known_state, band=self.band)
            delta = live.index_select(0, send).sub_(known.index_select(0, send))
            if send.numel() > limit:  # the largest differences; the rest wait (row_fraction)
                keep = largest_rows(delta, limit)
                send, delta = send.index_select(0, keep), delta.index_select(0, keep)
            change = state.index_select(0, send).sub_(known_state.index_select(0, send))
            message, decoded = codec.encode(send, delta, change)
            known.index_add_(0, send, decoded)
            known_state.index_add_(0, send, change)
            messages.append(message)
            counts.append(send.numel())
        got, sent, received = exchange_rows(
            torch.tensor(counts, dtype=torch.int64),
            joined(messages),
            [peer],
            self.codecs,
            self.group,
            (TAG_PAIR_COUNTS, TAG_PAIR_ROWS),
        )
        self.pair_sent += sent
        self.pair_received += received
        parts = split_message(got[peer][1], got[peer][0], self.codecs)
        for k, codec in enumerate(self.codecs):
            idx, values, changes = codec.decode(parts[k], copy=False)
            other, other_state = estimate[k]
            other.index_add_(0, idx, values)
            other_state.index_add_(0, idx, changes)
            self._average(self.live[k], known_by[k], estimate[k])

    def _average(
        self,
        live: tuple[Tensor, Tensor],
        known: tuple[Tensor, Tensor],
        other: tuple[Tensor, Tensor],
    ) -> None:
        """The CHOCO step: ``live += (estimate - known_by) * step`` on the rows where the two
        public copies differ. The peer adds the opposite (its ``known_by`` is this trainer's
        ``estimate`` and the reverse, bit for bit), so the sum over the trainers is kept
        exactly, and the workers' changes since the snapshot stay. The rows are chosen by a
        test both sides compute alike (the dead band scaled by the larger row)."""
        (table, state), (mine, mine_state), (theirs, theirs_state) = live, known, other
        rows = changed_rows(theirs, mine, theirs_state, mine_state, band=self.band, symmetric=True)
        move = theirs.index_select(0, rows).sub_(mine.index_select(0, rows)).mul_(self.step)
        table.index_add_(0, rows, move)
        move_state = theirs_state.index_select(0, rows).sub_(mine_state.index_select(0, rows))
        state.index_add_(0, rows, move_state.mul_(self.step))
        state.index_copy_(0, rows, state.index_select(0, rows).clamp_min_(0))

    def agree(self) -> None:
        """The exact mean of every trainer's rows (no worker trains)."""
        self.agreement.round(assign=True)
