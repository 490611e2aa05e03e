"""The rows of bench/dp_bench.py, their table and the issue's targets read off them.

Pure functions of the rows (no training), so the table of saved rows can be printed again
(``dp_bench.py --table-from``) and the arithmetic is tested on its own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

#: Issue 25's targets.
SPEEDUP_TARGET = 1.7  # 2 ranks over one, on a 1-partition graph
MRR_TOLERANCE = 0.01
BYTES_TARGET = 8.0  # row-sparse int8 over dense fp32
GATE_TARGET = 2.0  # even split's gate wait over the sampler's
#: The mode of the ceiling rows: N one-machine trainings at once, each pinned to its own core.
INDEPENDENT = "independent"


@dataclass
class Row:
    graph: str
    partitions: int
    mode: str  # "one machine" | "independent" | "partitioned" | "data_parallel"
    ranks: int
    strategy: str  # "-" on one machine
    precision: str
    sparse: str  # "rows" | "dense" | "-"
    edge_split: str  # "load_balancing" | "even" | "-"
    epoch_s: float
    wall_s: float
    mrr: float
    mb_per_epoch: float | None  # None on one machine
    bytes_source: str
    gate_wait_s: float | None  # per epoch, summed over trainers; None when not recorded
    #: of ``gate_wait_s``, the gate closed because the other trainer had not reached the round
    peer_wait_s: float | None = None
    #: every run's epoch seconds when the row is the median of several (``--repeats``)
    epoch_s_runs: list[float] = field(default_factory=list)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def combine(runs: list[Row]) -> Row:
    """One row of several runs of the same plan: the median of each measure (epoch time, MRR,
    bytes, gate wait), every run's epoch time kept. A VM's speed drifts by tens of percent
    over minutes; the runs of different rows are interleaved (``dp_bench.py --repeats``), so
    each row's median is taken over the same stretch of time."""
    if len(runs) == 1:
        return runs[0]
    return replace(
        runs[0],
        epoch_s=statistics.median(r.epoch_s for r in runs),
        wall_s=sum(r.wall_s for r in runs),
        mrr=statistics.median(r.mrr for r in runs),
        mb_per_epoch=_median([r.mb_per_epoch for r in runs]),
        gate_wait_s=_median([r.gate_wait_s for r in runs]),
        peer_wait_s=_median([r.peer_wait_s for r in runs]),
        epoch_s_runs=[r.epoch_s for r in runs],
    )


HEAD = (
    "graph",
    "partitions",
    "mode",
    "ranks",
    "strategy",
    "precision",
    "sparse",
    "edge split",
    "epoch s",
    "speed-up vs 1 rank",
    "filtered MRR",
    "MRR - 1 rank",
    "MB/epoch on the wire",
    "gate wait s/epoch",
    "of it waiting for the slower trainer",
)


def reference(rows: list[Row], row: Row) -> Row | None:
    """The one-machine row of ``row``'s graph and partition count."""
    return next(
        (
            r
            for r in rows
            if r.ranks == 1 and r.graph == row.graph and r.partitions == row.partitions
        ),
        None,
    )


def speedup(rows: list[Row], row: Row) -> float | None:
    """Epochs per second over the one-machine row's; an ``independent`` row (``ranks`` whole
    trainings at once, one per core) counts every one of its trainings' epochs: the most
    ``ranks`` cores of this machine give when nothing is shared but the hardware."""
    ref = reference(rows, row)
    if ref is None or row.epoch_s <= 0:
        return None
    per_run = ref.epoch_s / row.epoch_s
    return per_run * row.ranks if row.mode == INDEPENDENT else per_run


def _epoch_cell(row: Row) -> str:
    """The epoch seconds, with the runs' range when the row is a median of several."""
    if len(row.epoch_s_runs) < 2:
        return f"{row.epoch_s:.2f}"
    return f"{row.epoch_s:.2f} ({min(row.epoch_s_runs):.2f}-{max(row.epoch_s_runs):.2f})"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def markdown(caption: str, rows: list[Row]) -> str:
    """The caption, then one markdown table of every row."""
    lines = [caption, "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in rows:
        ref = reference(rows, r)
        dmrr = None if ref is None or r.ranks == 1 else r.mrr - ref.mrr
        cells = [
            r.graph,
            str(r.partitions),
            r.mode,
            str(r.ranks),
            r.strategy,
            r.precision,
            r.sparse,
            r.edge_split,
            _epoch_cell(r),
            _num(speedup(rows, r), ".2f") + ("x" if speedup(rows, r) is not None else ""),
            f"{r.mrr:.4f}",
            _num(dmrr, "+.4f"),
            _num(r.mb_per_epoch, ".1f"),
            _num(r.gate_wait_s, ".2f"),
            _num(r.peer_wait_s, ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def target_lines(rows: list[Row]) -> list[str]:
    """One line per target and graph that the rows allow to judge."""
    out = []
    # 1. 2 ranks >= 1.7x one rank on a 1-partition graph, MRR within 0.01
    for graph in sorted({r.graph for r in rows if r.partitions == 1 and r.graph != "skewed"}):
        ref = next((r for r in rows if (r.graph, r.partitions, r.ranks) == (graph, 1, 1)), None)
        cands = [
            r
            for r in rows
            if r.graph == graph and r.partitions == 1 and r.ranks == 2 and r.mode == "data_parallel"
        ]
        ceiling = next((r for r in rows if r.graph == graph and r.mode == INDEPENDENT), None)
        if ref is None or not cands:
            continue
        close = [r for r in cands if abs(r.mrr - ref.mrr) <= MRR_TOLERANCE]
        best = max(close or cands, key=lambda r: ref.epoch_s / r.epoch_s)
        gain = ref.epoch_s / best.epoch_s
        out.append(
            f"* {graph}, 1 partition: 2 ranks {gain:.2f}x one rank, MRR {best.mrr - ref.mrr:+.4f} "
            f"({best.strategy} {best.precision} {best.sparse}; target >= {SPEEDUP_TARGET}x within "
            f"{MRR_TOLERANCE}): {_verdict(bool(close) and gain >= SPEEDUP_TARGET)}"
        )
        if ceiling is not None:
            out.append(
                f"  ceiling on this machine: {ceiling.ranks} independent trainings at once, one "
                f"per core, {speedup(rows, ceiling) or 0:.2f}x one alone"
            )
    # 2. row-sparse int8 moves >= 8x fewer bytes than dense fp32 at MRR within 0.01
    for r in rows:
        if r.mode != "data_parallel" or (r.precision, r.sparse) != ("int8", "rows"):
            continue
        dense = next(
            (
                o
                for o in rows
                if (o.graph, o.partitions, o.ranks, o.strategy, o.edge_split)
                == (r.graph, r.partitions, r.ranks, r.strategy, r.edge_split)
                and (o.precision, o.sparse) == ("fp32", "dense")
            ),
            None,
        )
        if dense is None or not r.mb_per_epoch or dense.mb_per_epoch is None:
            continue
        ratio = dense.mb_per_epoch / r.mb_per_epoch
        dmrr = r.mrr - dense.mrr
        ok = ratio >= BYTES_TARGET and abs(dmrr) <= MRR_TOLERANCE
        out.append(
            f"* {r.graph}, {r.partitions} partition(s), {r.ranks} ranks, {r.strategy}: row-sparse "
            f"int8 moves {ratio:.1f}x fewer bytes than dense fp32, MRR {dmrr:+.4f} (target >= "
            f"{BYTES_TARGET:.0f}x within {MRR_TOLERANCE}): {_verdict(ok)}"
        )
    # 3. the sampler cuts gate waiting >= 2x against an even split: the whole wait, and the
    # part spent waiting for the slower trainer (what the split decides)
    for r in rows:
        if r.edge_split != "even":
            continue
        lb = next(
            (
                o
                for o in rows
                if (o.graph, o.partitions, o.ranks, o.strategy, o.precision, o.sparse)
                == (r.graph, r.partitions, r.ranks, r.strategy, r.precision, r.sparse)
                and o.edge_split == "load_balancing"
            ),
            None,
        )
        if lb is None:
            continue
        for what, even, sampler in (
            ("gate wait", r.gate_wait_s, lb.gate_wait_s),
            ("of it waiting for the slower trainer", r.peer_wait_s, lb.peer_wait_s),
        ):
            if even is None or sampler is None or even + sampler == 0:
                continue  # not recorded, or nobody waited (no synchronous round in a bucket)
            ratio = even / sampler if sampler > 0 else float("inf")
            out.append(
                f"* {r.graph}, {r.ranks} ranks, {r.strategy} {r.precision}: {what} even "
                f"{even:.2f} s / sampler {sampler:.2f} s = {ratio:.2f}x (target >= "
                f"{GATE_TARGET:.0f}x): {_verdict(ratio >= GATE_TARGET)}"
            )
    return ["Targets (issue 25):", *out] if out else []
