"""Everybody's changes since the last round, summed or averaged, applied to the live tensors.

The data round of the ``allreduce`` (sum) and ``async_model_average`` (mean) strategies. After
each round every trainer holds ``last``, the same agreed value (bit for bit: every trainer
decodes the same bytes of each sum, see :class:`~bigembed.communication.primitives.ShardedReduce`);
its live tensors hold ``last`` plus whatever its workers changed during the round, which the
next round's delta carries (nothing the workers do while a round is in flight is lost).

Averaging the deltas is averaging the models: every trainer started the round from ``last``,
so the mean of their values is ``last`` plus the mean of their changes. Adagrad accumulators
of the merged value are clamped at 0 on every trainer alike (a lossy sum near 0 can dip below
it); the clamp is part of the agreed value, not a change anybody sends.

With ``communication.sparse_rows``, the row tables (``SharedTensors.row_tables``) and their
row state leave the dense reduction and travel as row-sparse deltas in the same round
(:class:`~bigembed.communication.sparse_reduce.RowReduce`, which keeps the same guarantees:
the sum or mean, bit-identical on every trainer).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from bigembed.communication.hierarchical import make_reduce
from bigembed.communication.param_server import ShardPlan, gather, scatter_add, scatter_copy
from bigembed.communication.sparse_reduce import RowReduce
from bigembed.communication.sparse_rows import row_tensors
from bigembed.communication.strategies.base import SharedTensors, StrategyEnv


class DeltaReduce:
    def __init__(self, env: StrategyEnv, shared: SharedTensors, *, mean: bool) -> None:
        self.mean = mean
        self.world = len(env.trainers)
        self.flat = shared.flat
        sparse = env.sparse_rows and bool(shared.row_tables)
        skip = row_tensors(shared.row_tables) if sparse else frozenset()
        numels = [0 if i in skip else n for i, n in enumerate(shared.numels)]
        self.plan = ShardPlan(shared.names, numels, env.trainers, shared.nonnegative)
        hosts = env.hosts if env.hierarchical else None  # flat, or host by host
        self.reduce = make_reduce(env.rank, self.plan, env.codec, env.group, env.trainers, hosts)
        self.owners = self.plan.active_servers
        self.last = {s: gather(self.flat, self.plan.segments[s]) for s in self.owners}
        self.rows = (
            RowReduce(
                env.rank,
                env.trainers,
                env.group,
                env.codec,
                shared.tensors,
                shared.row_tables,
                mean=mean,
                fraction=env.row_fraction,
            )
            if sparse
            else None
        )

    @property
    def bytes_sent(self) -> int:
        return self.reduce.bytes_sent + (self.rows.bytes_sent if self.rows else 0)

    @property
    def bytes_received(self) -> int:
        return self.reduce.bytes_received + (self.rows.bytes_received if self.rows else 0)

    def round(self, snapped: Callable[[], None] | None = None) -> None:
        """A data round: the live tensors keep what the workers change meanwhile.
        ``snapped``: called once the values are read (an overlapped round opens the gate)."""
        self._round(assign=False, snapped=snapped)

    def agree(self) -> None:
        """A round while no worker trains (a checkpoint): every trainer ends with the agreed
        values bit for bit (adding ``merged - snap`` to ``snap`` could round differently)."""
        self._round(assign=True)

    def _round(self, assign: bool, snapped: Callable[[], None] | None = None) -> None:
        snaps = {s: gather(self.flat, self.plan.segments[s]) for s in self.owners}
        if self.rows is not None:  # the row tables' round first: it calls snapped once read
            self.rows.round(assign, snapped)
        elif snapped is not None:
            snapped()
        sums = self.reduce.reduce({s: snaps[s] - self.last[s] for s in self.owners})
        for s in self.owners:
            change = sums[s] / self.world if self.mean else sums[s]
            merged = self.last[s] + change
            self._clamp(s, merged)
            if assign:
                scatter_copy(self.flat, self.plan.segments[s], merged)
            else:
                scatter_add(self.flat, self.plan.segments[s], merged - snaps[s])
            self.last[s] = merged

    def _clamp(self, owner: int, merged: Tensor) -> None:
        offset = 0
        for seg in self.plan.segments[owner]:
            if seg.tensor in self.plan.nonnegative:
                merged[offset : offset + seg.size].clamp_min_(0)
            offset += seg.size
