"""Full ranking of edges against every entity of the corrupted side's type, raw and filtered.

For each edge and each side, the candidate set is every entity of that side's type, across all
partitions (unlike PBG, whose ranking never leaves the edge's partition). The true entity's
rank is 1 + the number of other candidates scoring at least as high (ties count against it);
the filtered rank leaves out candidates that form a known true edge. Scores are computed in
chunks of queries x one partition of candidates at a time, so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bigembed.eval.filters import KnownEdges
from bigembed.model.scoring import ScoringModel

EmbeddingSource = Callable[[str, int], Tensor]


@dataclass
class EvalEdges:
    """Edges in global entity ids (index over all partitions of the type)."""

    lhs: np.ndarray
    rel: np.ndarray
    rhs: np.ndarray

    def __len__(self) -> int:
        return len(self.lhs)


@dataclass
class SideRanks:
    raw: np.ndarray  # (E,) int64
    filtered: np.ndarray | None  # (E,) int64, or None without filters


@dataclass
class RankingResult:
    rel: np.ndarray
    lhs: SideRanks  # ranks of the true head among corrupted heads
    rhs: SideRanks  # ranks of the true tail among corrupted tails


class _Entities:
    """Global-id access to one entity type's partitions."""

    def __init__(self, etype: str, bases: np.ndarray, source: EmbeddingSource) -> None:
        self.etype = etype
        self.bases = bases
        self.source = source

    @property
    def partitions(self) -> int:
        return len(self.bases) - 1

    def table(self, part: int) -> Tensor:
        return self.source(self.etype, part)

    def gather(self, idx: np.ndarray) -> Tensor:
        parts = np.searchsorted(self.bases, idx, side="right") - 1
        out = None
        for p in np.unique(parts):
            sel = np.nonzero(parts == p)[0]
            rows = self.table(int(p))[torch.from_numpy(idx[sel] - self.bases[p])]
            if out is None:
                out = rows.new_empty((len(idx), rows.shape[1]))
            out[torch.from_numpy(sel)] = rows
        assert out is not None
        return out


@torch.no_grad()
def rank_edges(
    model: ScoringModel,
    source: EmbeddingSource,
    bases: dict[str, np.ndarray],
    edges: EvalEdges,
    known: KnownEdges | None,
    *,
    chunk_size: int = 1024,
    progress: Callable[[int], None] | None = None,
) -> RankingResult:
    """Rank every edge's head and tail against all entities; ``progress(n)`` after each chunk."""
    cfg = model.config
    e = len(edges)
    out = {side: (np.zeros(e, np.int64), np.zeros(e, np.int64) if known else None) for side in "lr"}
    groups = [np.arange(e)] if model.dynamic else [
        np.nonzero(edges.rel == r)[0] for r in range(len(cfg.relations))
    ]
    for sel in groups:
        if len(sel) == 0:
            continue
        ridx = 0 if model.dynamic else int(edges.rel[sel[0]])
        rcfg = model.relation_config(ridx)
        lhs_ents = _Entities(rcfg.lhs, bases[rcfg.lhs], source)
        rhs_ents = _Entities(rcfg.rhs, bases[rcfg.rhs], source)
        for start in range(0, len(sel), chunk_size):
            rows = sel[start : start + chunk_size]
            _rank_chunk(model, ridx, edges, rows, lhs_ents, rhs_ents, known, out)
            if progress:
                progress(len(rows))
    return RankingResult(
        rel=edges.rel.copy(),
        lhs=SideRanks(*out["l"]),
        rhs=SideRanks(*out["r"]),
    )


def _rank_chunk(model, ridx, edges, rows, lhs_ents, rhs_ents, known, out) -> None:
    cmp = model.comparator
    rel = torch.from_numpy(edges.rel[rows].astype(np.int64))
    h, t = edges.lhs[rows], edges.rhs[rows]
    lhs_x = model._adjust(lhs_ents.gather(h), lhs_ents.etype)
    rhs_x = model._adjust(rhs_ents.gather(t), rhs_ents.etype)
    if model.dynamic:
        # corrupt lhs: c(lhs', op_rhs[r](rhs)); corrupt rhs: c(rhs', op_lhs[r](lhs))
        lhs_anchor = cmp.prepare(model.rhs_operators[0](rhs_x, rel))
        rhs_anchor = cmp.prepare(model.lhs_operators[0](lhs_x, rel))
        lhs_cand = lambda x: cmp.prepare(model._adjust(x, lhs_ents.etype))  # noqa: E731
        rhs_cand = lambda x: cmp.prepare(model._adjust(x, rhs_ents.etype))  # noqa: E731
    else:
        op = model.rhs_operator(ridx)
        lhs_anchor = cmp.prepare(op(rhs_x))
        rhs_anchor = cmp.prepare(lhs_x)
        lhs_cand = lambda x: cmp.prepare(model._adjust(x, lhs_ents.etype))  # noqa: E731
        rhs_cand = lambda x: cmp.prepare(op(model._adjust(x, rhs_ents.etype)))  # noqa: E731
    for side, anchors, ents, cand_fn, true_idx in (
        ("l", lhs_anchor, lhs_ents, lhs_cand, h),
        ("r", rhs_anchor, rhs_ents, rhs_cand, t),
    ):
        true_vec = cand_fn(ents.gather(true_idx))
        pos = cmp.neg(anchors.unsqueeze(1), true_vec.unsqueeze(1)).view(-1)
        raw = torch.zeros(len(rows), dtype=torch.long)
        filt_rows = filt_cols = None
        if known is not None:
            q = edges.rel[rows]
            frows, fcols = known.true_tails(h, q) if side == "r" else known.true_heads(t, q)
            keep = fcols != true_idx[frows]
            filt_rows, filt_cols = frows[keep], fcols[keep]
            filtered_out = torch.zeros(len(rows), dtype=torch.long)
        for p in range(ents.partitions):
            lo, hi = int(ents.bases[p]), int(ents.bases[p + 1])
            if hi == lo:
                continue
            cands = cand_fn(ents.table(p))
            scores = cmp.neg(anchors.unsqueeze(0), cands.unsqueeze(0)).squeeze(0)
            raw += torch.count_nonzero(scores >= pos.unsqueeze(1), dim=1)
            in_p = (true_idx >= lo) & (true_idx < hi)
            if in_p.any():  # the true entity itself is not a competitor
                r_sel = np.nonzero(in_p)[0]
                own = scores[torch.from_numpy(r_sel), torch.from_numpy(true_idx[r_sel] - lo)]
                raw[torch.from_numpy(r_sel)] -= (own >= pos[torch.from_numpy(r_sel)]).long()
            if filt_rows is not None:
                m = (filt_cols >= lo) & (filt_cols < hi)
                if m.any():
                    fr = torch.from_numpy(filt_rows[m])
                    vals = scores[fr, torch.from_numpy(filt_cols[m] - lo)]
                    filtered_out.index_add_(0, fr, (vals >= pos[fr]).long())
        out[side][0][rows] = (raw + 1).numpy()
        if filt_rows is not None:
            out[side][1][rows] = (raw - filtered_out + 1).numpy()
