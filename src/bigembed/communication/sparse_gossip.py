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
    ) -> None:
        self.group = group
        self.tables = row_tables(tensors, tables)
        self.live = [(tensors[t.table].data, tensors[t.state].data) for t in self.tables]
        # every trainer starts from rank 0's values: the copies of each other start equal
        self.initial = [(a.clone(), s.clone()) for a, s in self.live]
        self.codecs = [RowCodec(codec, t.dim) for t in self.tables]
        self.band = 0.0 if codec.lossless else DEAD_BAND
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
        for (live, state), (known, known_state), codec in zip(
            self.live, known_by, self.codecs, strict=True
        ):
            send = changed_rows(live, known, state, known_state, band=self.band)
            snap, snap_state = live[send], state[send]
            change = snap_state - known_state[send]
            message, decoded = codec.encode(send, snap - known[send], change)
            known.index_add_(0, send, decoded)
            known_state.index_add_(0, send, change)
            messages.append(message)
            counts.append(send.numel())
        got, sent, received = exchange_rows(
            torch.tensor(counts, dtype=torch.int64),
            torch.cat(messages),
            [peer],
            self.codecs,
            self.group,
            (TAG_PAIR_COUNTS, TAG_PAIR_ROWS),
        )
        self.pair_sent += sent
        self.pair_received += received
        parts = split_message(got[peer][1], got[peer][0], self.codecs)
        for k, codec in enumerate(self.codecs):
            idx, values, changes = codec.decode(parts[k])
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
        """The CHOCO step: ``live += (estimate - known_by) / 2`` on the rows where the two
        public copies differ. The peer adds the opposite (its ``known_by`` is this trainer's
        ``estimate`` and the reverse, bit for bit), so the sum over the trainers is kept
        exactly, and the workers' changes since the snapshot stay. The rows are chosen by a
        test both sides compute alike (the dead band scaled by the larger row)."""
        (table, state), (mine, mine_state), (theirs, theirs_state) = live, known, other
        rows = changed_rows(theirs, mine, theirs_state, mine_state, band=self.band, symmetric=True)
        table.index_add_(0, rows, (theirs[rows] - mine[rows]) / 2)
        state.index_add_(0, rows, (theirs_state[rows] - mine_state[rows]) / 2)
        state[rows] = state[rows].clamp_min(0)

    def agree(self) -> None:
        """The exact mean of every trainer's rows (no worker trains)."""
        self.agreement.round(assign=True)
