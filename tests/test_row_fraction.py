"""``communication.row_fraction``: a data round sends only the rows with the largest changes
(plus error-feedback residual), at most a fraction of the table; the other rows' changes wait
in ``live - last`` and go out later (error feedback for the unsent rows: delayed, never lost).

Trainers run as threads over in-memory queues (``support.row_wire``). The accounting tests use
dyadic values, so every sum below is exact in float32: after every round, what a trainer sent
plus what it kept back equals the sum of its local changes, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.communication import get_codec
from bigembed.communication.sparse_rows import RowCodec, largest_rows, row_limit
from support.row_wire import RowWire, in_threads

ROWS, DIM, LIMIT = 40, 6, 5
FRACTION = LIMIT / ROWS


def _start(rng: np.random.Generator) -> list[torch.Tensor]:
    """A table of multiples of 2**-10 in [0, 1) and its row state (ones)."""
    table = torch.from_numpy(rng.integers(0, 1024, (ROWS, DIM)).astype(np.float32)) / 1024
    return [table, torch.ones(ROWS)]


def _totals() -> list[torch.Tensor]:
    """Sums of changes to a table and its state (float64: exact for the dyadic values)."""
    return [torch.zeros(ROWS, DIM, dtype=torch.float64), torch.zeros(ROWS, dtype=torch.float64)]


def _change(
    rng: np.random.Generator, tables: list[torch.Tensor], local: list[torch.Tensor]
) -> None:
    """12 distinct rows change by multiples of 2**-12 (values and state), added to ``local``."""
    idx = torch.from_numpy(rng.choice(ROWS, 12, replace=False))
    change = torch.from_numpy(rng.integers(-31, 32, (12, DIM)).astype(np.float32)) / 4096
    grown = torch.from_numpy(rng.integers(1, 32, 12).astype(np.float32)) / 4096
    for (table, state), (total, total_state) in [(tables, local)]:
        table.index_add_(0, idx, change)
        state.index_add_(0, idx, grown)
        total.index_add_(0, idx, change.double())
        total_state.index_add_(0, idx, grown.double())


def test_row_limit_and_largest_rows() -> None:
    assert row_limit(1.0, ROWS) == ROWS
    assert row_limit(FRACTION, ROWS) == LIMIT
    assert row_limit(0.3, 10) == 3 and row_limit(0.31, 10) == 4  # rounded up
    assert row_limit(1e-9, ROWS) == 1  # never nothing
    target = torch.zeros(6, 2)
    target[:, 0] = torch.tensor([0.5, -3.0, 1.0, 2.0, -0.1, 0.0])
    assert largest_rows(target, 3).tolist() == [1, 2, 3]  # by norm, positions sorted
    assert largest_rows(target, 6).tolist() == list(range(6))


def _reducers(
    monkeypatch: pytest.MonkeyPatch, precision: str, world: int, seed: int
) -> tuple[Any, list[list[torch.Tensor]], list[torch.Tensor], RowWire]:
    import bigembed.communication.sparse_reduce as sparse_reduce

    wire = RowWire()
    monkeypatch.setattr(sparse_reduce, "exchange_rows", wire.exchange_rows)
    start = _start(np.random.default_rng(seed))
    tables = [[t.clone() for t in start] for _ in range(world)]
    reducers = [
        sparse_reduce.RowReduce(
            r,
            range(world),
            None,
            get_codec(precision),
            tables[r],
            {0: 1},
            mean=False,
            fraction=FRACTION,
        )
        for r in range(world)
    ]
    return reducers, tables, start, wire


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_only_the_largest_rows_travel_and_the_rest_is_kept(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Two trainers change 12 rows each for 4 rounds, then stop; every round each sends at
    most LIMIT rows, the largest changes (plus residual) among its changed rows, and after every
    round ``sent + (live - last) + quantization residual == its local changes`` (exactly in
    fp32). The backlog drains, and both end at the exact sum of all changes."""
    world = 2
    reducers, tables, start, wire = _reducers(monkeypatch, precision, world, seed=3)
    codec = RowCodec(get_codec(precision), DIM)
    rng = np.random.default_rng(4)
    local = [_totals() for _ in range(world)]
    sent = [_totals() for _ in range(world)]
    limited_rounds = 0
    for rnd in range(16):
        if rnd < 4:
            for r in range(world):
                _change(rng, tables[r], local[r])
        pending = []
        for r, reducer in enumerate(reducers):
            (live, state), (last, last_state) = tables[r], reducer.last[0]
            mask = (live != last).any(dim=1) | (state != last_state)
            if reducer.feedback[0].pending is not None:  # residuals above the dead band
                mask |= reducer.feedback[0].pending
            changed = mask.nonzero().view(-1)
            target = (live - last)[changed].double()
            residual = reducer.feedback[0].residual
            if residual is not None:
                target += residual[changed].double()
            pending.append((changed, target.square().sum(dim=1)))
        in_threads(world, lambda r: reducers[r].round(False))
        for r, reducer in enumerate(reducers):
            counts, payload = wire.sent[r][-1]
            changed, norms = pending[r]
            k = min(LIMIT, changed.numel())
            assert counts == [k] and payload.numel() == codec.nbytes(k)  # nothing else travels
            limited_rounds += changed.numel() > LIMIT
            idx, values, changes = codec.decode(payload)
            chosen = torch.isin(changed, idx)
            assert int(chosen.sum()) == k  # every row sent was a changed one
            if k < changed.numel():  # the largest: no unsent row's change beats a sent one's
                assert float(norms[chosen].min()) >= float(norms[~chosen].max())
            sent[r][0].index_add_(0, idx, values.double())
            sent[r][1].index_add_(0, idx, changes.double())
            (live, state), (last, last_state) = tables[r], reducer.last[0]
            kept = (live - last).double()
            residual = reducer.feedback[0].residual
            if residual is not None:
                kept += residual.double()
            if precision == "fp32":
                assert torch.equal(sent[r][0] + kept, local[r][0]), rnd
            else:  # float32 rounding of the sums only
                assert float((sent[r][0] + kept - local[r][0]).abs().max()) < 1e-6, rnd
            assert torch.equal(sent[r][1] + (state - last_state).double(), local[r][1]), rnd
    assert limited_rounds >= 4  # the limit did bind
    assert all(counts == [0] for counts, _ in (wire.sent[r][-1] for r in range(world)))  # drained
    want = start[0].double() + local[0][0] + local[1][0]
    for table, state in tables:
        assert torch.equal(table, tables[0][0]) and torch.equal(state, tables[0][1])
        err = float((table.double() - want).abs().max())
        assert err == 0 if precision == "fp32" else err < 1e-3 * math.sqrt(DIM)
        assert torch.equal(state.double(), start[1].double() + local[0][1] + local[1][1])


def test_an_agreement_sends_every_changed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """An assigning round (a checkpoint's agreement) ignores the limit: afterwards every
    trainer holds the exact sum, bit for bit alike."""
    world = 2
    reducers, tables, start, wire = _reducers(monkeypatch, "fp32", world, seed=5)
    rng = np.random.default_rng(6)
    local = [_totals() for _ in range(world)]
    for _ in range(3):
        for r in range(world):
            _change(rng, tables[r], local[r])
    in_threads(world, lambda r: reducers[r].round(True))
    assert all(wire.sent[r][-1][0][0] > LIMIT for r in range(world))
    want = start[0].double() + local[0][0] + local[1][0]
    for table, _ in tables:
        assert torch.equal(table.double(), want)


def test_gossip_pair_rounds_send_at_most_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``decentralized``'s pair rounds with a limit: at most LIMIT rows per message, the
    trainers' sum kept exactly, and they still meet (the backlog goes out in later rounds)."""
    import bigembed.communication.sparse_gossip as sparse_gossip
    from bigembed.communication.primitives import peer_of

    wire = RowWire()
    monkeypatch.setattr(sparse_gossip, "exchange_rows", wire.exchange_rows)
    world = 2
    start = _start(np.random.default_rng(7))
    tables = [[t.clone() for t in start] for _ in range(world)]
    gossips = [
        sparse_gossip.RowGossip(
            r, range(world), None, get_codec("fp32"), tables[r], {0: 1}, fraction=FRACTION
        )
        for r in range(world)
    ]
    rng = np.random.default_rng(8)
    local = [_totals() for _ in range(world)]
    for rnd in range(40):
        if rnd < 4:
            for r in range(world):
                _change(rng, tables[r], local[r])

        def meet(r: int, rnd: int = rnd) -> None:
            peer = peer_of(r, list(range(world)), rnd)
            assert peer is not None
            gossips[r].pair_round(peer)

        in_threads(world, meet)
        assert all(wire.sent[r][-1][0][0] <= LIMIT for r in range(world))
        kept = tables[0][0].double() + tables[1][0].double()
        want = 2 * start[0].double() + local[0][0] + local[1][0]
        assert float((kept - want).abs().max()) < 1e-6, rnd
    assert max(len(wire.sent[r]) for r in range(world)) == 40
    # they met (with the halfway step instead of min(1/2, fraction) they stay ~0.2 apart)
    assert float((tables[0][0] - tables[1][0]).abs().max()) < 1e-3


def test_async_ps_pushes_its_own_range_and_the_largest_remote_rows() -> None:
    """``async_ps``: rows of the trainer's own shard reach it without the network and are
    always pushed; of the others', at most the limit (of the remote rows), the largest."""
    from bigembed.communication.sparse_sharer import RowSharer

    start = _start(np.random.default_rng(9))
    tensors = [t.clone() for t in start]
    sharer = RowSharer(0, [0, 1], None, get_codec("fp32"), tensors, {0: 1}, print, 100.0, 0.1)
    assert sharer.own == [(0, ROWS // 2)] and sharer.limits == [2]  # ceil(0.1 * 20 remote rows)
    idx = torch.tensor([1, 3, 22, 25, 30, 39])
    tensors[0][idx] += torch.tensor([1.0, 1.0, 0.5, 4.0, 0.25, 2.0])[:, None] / 64
    rows, values, state = sharer._choose(0, (idx, tensors[0][idx], tensors[1][idx]))
    assert rows.tolist() == [1, 3, 25, 39]
    assert torch.equal(values, tensors[0][rows]) and torch.equal(state, tensors[1][rows])
