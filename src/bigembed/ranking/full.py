"""Full ranking of edges against every entity of the corrupted side's type, raw and filtered.

For each edge and each side, the candidates are all entities of that side's type, across all
partitions (PBG's own eval never leaves the edge's partition). The true entity's rank is
1 + the number of *other* candidates scoring at least as high (ties count against it); the
filtered rank leaves out candidates that form a known true edge (never the true entity).

How it stays fast and bounded:

* edges are sorted by their *anchor* (what the candidates are compared with: e.g. the
  transformed tail and relation when heads are ranked), and edges sharing an anchor share one
  row of scores (many-to-one relations give many edges per anchor, so this removes a large
  share of the matrix products);
* the loop runs partition by partition and block by block of candidates (each prepared once:
  global embedding, operator, normalisation), then over chunks of anchors, so one score matrix
  is at most ``max_scores`` floats and each partition is read once per pass;
* counting (``scores >= positive``) and the filter corrections run in numpy on the matrix
  the product produced, with no copies for edges that own their anchor;
* the products run in the model's compute dtype (``compute_dtype``: bf16 where chosen), the
  scores upcast to fp32 and compared with the positives' fp32 scores (:func:`_scorer`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bigembed.model import Comparator, DotComparator, ScoringModel
from bigembed.ranking.directions import direction, pair_scores
from bigembed.ranking.filters import KnownEdges

EmbeddingSource = Callable[[str, int], Tensor]
"""``source(entity_type, partition)`` -> that partition's stored embeddings ``(count, dim)``."""

SIDES = ("lhs", "rhs")


@dataclass
class EvalEdges:
    """Edges in global entity ids (index over all partitions of the type)."""

    lhs: np.ndarray
    rel: np.ndarray
    rhs: np.ndarray

    def __post_init__(self) -> None:
        self.lhs = np.asarray(self.lhs, dtype=np.int64)
        self.rel = np.asarray(self.rel, dtype=np.int64)
        self.rhs = np.asarray(self.rhs, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lhs)

    @staticmethod
    def concat(parts: list[EvalEdges]) -> EvalEdges:
        if not parts:
            return EvalEdges(np.empty(0), np.empty(0), np.empty(0))
        return EvalEdges(
            np.concatenate([p.lhs for p in parts]),
            np.concatenate([p.rel for p in parts]),
            np.concatenate([p.rhs for p in parts]),
        )


@dataclass
class SideRanks:
    """Ranks of the true entity of one side among all candidates of its type."""

    raw: np.ndarray  # (E,) int64
    candidates: np.ndarray  # (E,) candidates including the true entity
    filtered: np.ndarray | None = None  # (E,) int64, or None without filters
    removed: np.ndarray | None = None  # (E,) known true others left out by the filter

    def ranks(self, filtered: bool) -> np.ndarray:
        out = self.filtered if filtered else self.raw
        if out is None:
            raise ValueError("no filtered ranks: rank_edges ran without known edges")
        return out

    def auc(self, filtered: bool) -> np.ndarray:
        """Per edge: the fraction of the other candidates scoring strictly below the true one."""
        cands = self.candidates - (self.removed if filtered and self.removed is not None else 0)
        below = cands - self.ranks(filtered)
        return below / np.maximum(cands - 1, 1)


@dataclass
class RankingResult:
    rel: np.ndarray
    lhs: SideRanks | None  # ranks of the true head among the head candidates
    rhs: SideRanks | None  # ranks of the true tail among the tail candidates

    def side(self, name: str) -> SideRanks | None:
        return self.lhs if name == "lhs" else self.rhs


@dataclass
class _Task:
    """Rank one side of a group of edges that share a candidate type and candidate transform."""

    etype: str  # candidate entity type
    rows: np.ndarray  # edge indices
    keys: np.ndarray  # anchor key per edge of ``rows``: equal keys give equal anchors
    true_ids: np.ndarray  # true entity (global id) per edge of ``rows``
    anchors: Callable[[np.ndarray], Tensor]  # edge indices -> prepared anchors (n, D)
    candidates: Callable[[Tensor], Tensor]  # stored rows -> prepared candidates (n, D)
    known: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None  # edge idx -> pairs


class _Rows:
    """Global-id row access to one entity type's partitions."""

    def __init__(self, source: EmbeddingSource, bases: dict[str, np.ndarray]) -> None:
        self.source = source
        self.bases = bases

    def gather(self, etype: str, ids: np.ndarray) -> Tensor:
        bases = self.bases[etype]
        parts = np.searchsorted(bases, ids, side="right") - 1
        out: Tensor | None = None
        for part in np.unique(parts):
            sel = np.flatnonzero(parts == part)
            offsets = torch.from_numpy(ids[sel] - bases[part])
            rows = self.source(etype, int(part)).index_select(0, offsets)
            if out is None:
                out = rows.new_empty((len(ids), rows.shape[1]))
            out[torch.from_numpy(sel)] = rows
        assert out is not None
        return out


def _tasks(
    model: ScoringModel, rows: _Rows, edges: EvalEdges, known: KnownEdges | None, side: str
) -> Iterator[_Task]:
    """The ranking tasks of one side: groups of edges sharing candidates (type and transform)."""
    h, r, t = edges.lhs, edges.rel, edges.rhs
    nrel = max(model.num_relations, int(r.max()) + 1 if len(r) else 1)
    given, true = (t, h) if side == "lhs" else (h, t)

    def lookup(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert known is not None
        if side == "lhs":
            return known.true_heads(t[idx], r[idx])
        return known.true_tails(h[idx], r[idx])

    filt = lookup if known is not None else None
    if model.dynamic:
        d = direction(model, side, 0)

        def dyn_anchors(idx: np.ndarray) -> Tensor:
            return d.anchors(rows.gather(d.source_type, given[idx]), torch.from_numpy(r[idx]))

        yield _Task(
            d.target_type,
            np.arange(len(edges)),
            given * nrel + r,
            true,
            dyn_anchors,
            d.candidates,
            filt,
        )
        return

    dirs = [direction(model, side, i) for i in range(len(model.spec.relations))]
    if side == "lhs":
        # candidates (lhs + g) do not depend on the relation: one task per lhs type
        groups: dict[str | int, list[int]] = {}  # task key -> relation indices
        for i, d in enumerate(dirs):
            groups.setdefault(d.target_type, []).append(i)
    else:
        # the operator acts on the candidates: one task per relation
        groups = {i: [i] for i in range(len(dirs))}
    for members in groups.values():
        sel = np.flatnonzero(np.isin(r, members))
        if len(sel) == 0:
            continue

        def std_anchors(idx: np.ndarray) -> Tensor:
            out: Tensor | None = None
            for ridx in np.unique(r[idx]).tolist():
                part = np.flatnonzero(r[idx] == ridx)
                d = dirs[ridx]
                y = d.anchors(rows.gather(d.source_type, given[idx[part]]), None)
                if out is None:
                    out = y.new_empty((len(idx), y.shape[1]))
                out[torch.from_numpy(part)] = y
            assert out is not None
            return out

        d0 = dirs[members[0]]
        yield _Task(
            d0.target_type,
            sel,
            given[sel] * nrel + r[sel],
            true[sel],
            std_anchors,
            d0.candidates,
            filt,
        )


@torch.no_grad()
def rank_edges(
    model: ScoringModel,
    source: EmbeddingSource,
    bases: dict[str, np.ndarray],
    edges: EvalEdges,
    known: KnownEdges | None,
    *,
    chunk_size: int = 1024,
    max_scores: int = 1 << 24,
    super_chunk: int = 1 << 15,
    progress: Callable[[float], None] | None = None,
) -> RankingResult:
    """Rank every edge's head and tail against all entities of their types.

    ``source(type, part)`` gives stored embeddings (without the global embedding; the model
    adds it); ``bases[type]`` the global id of each partition's first entity plus the total.
    ``chunk_size`` anchors are scored at a time against at most ``max_scores / chunk_size``
    candidates; ``super_chunk`` edges share one pass over the partitions. ``progress(n)`` is
    called with the (fractional) number of edges finished, so a bar over edges fills once.
    """
    model.eval()
    rows = _Rows(source, bases)
    e = len(edges)
    result: dict[str, SideRanks] = {}
    for side in SIDES:
        ranks = SideRanks(
            raw=np.zeros(e, np.int64),
            candidates=np.zeros(e, np.int64),
            filtered=np.zeros(e, np.int64) if known is not None else None,
            removed=np.zeros(e, np.int64) if known is not None else None,
        )
        for task in _tasks(model, rows, edges, known, side):
            _run_task(
                model,
                task,
                bases[task.etype],
                rows,
                ranks,
                chunk_size,
                max_scores,
                super_chunk,
                progress,
            )
        result[side] = ranks
    return RankingResult(rel=edges.rel.copy(), lhs=result["lhs"], rhs=result["rhs"])


def _run_task(
    model: ScoringModel,
    task: _Task,
    bases: np.ndarray,
    rows: _Rows,
    out: SideRanks,
    chunk_size: int,
    max_scores: int,
    super_chunk: int,
    progress: Callable[[float], None] | None,
) -> None:
    order = np.argsort(task.keys, kind="stable")
    num_candidates = int(bases[-1])
    for start in range(0, len(order), super_chunk):
        pos_in_task = order[start : start + super_chunk]
        idx = task.rows[pos_in_task]  # edge indices, sorted by anchor key
        keys = task.keys[pos_in_task]
        true_ids = task.true_ids[pos_in_task]
        raw, filt_ge, removed = _rank_sorted(
            model,
            task,
            idx,
            keys,
            true_ids,
            bases,
            rows,
            chunk_size,
            max_scores,
            (lambda n: progress(n / 2)) if progress else None,
            num_candidates,
        )
        out.raw[idx] = raw
        out.candidates[idx] = num_candidates
        if out.filtered is not None and filt_ge is not None and removed is not None:
            out.filtered[idx] = raw - filt_ge
            assert out.removed is not None
            out.removed[idx] = removed


def _rank_sorted(
    model,
    task: _Task,
    idx: np.ndarray,
    keys: np.ndarray,
    true_ids: np.ndarray,
    bases: np.ndarray,
    rows: _Rows,
    chunk_size: int,
    max_scores: int,
    progress: Callable[[float], None] | None,
    num_candidates: int,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Raw ranks, filtered-out competitors and removed counts of edges sorted by anchor key."""
    cmp = model.comparator
    n = len(idx)
    is_first = np.ones(n, dtype=bool)
    is_first[1:] = keys[1:] != keys[:-1]
    first = np.flatnonzero(is_first)  # edge position of each anchor's first edge
    inv = np.cumsum(is_first) - 1  # anchor of each edge
    num_anchors = len(first)
    anchors = task.anchors(idx[first]).float().contiguous()

    # positive scores, with the comparator's own formula for "candidate" scores
    pos_t = torch.empty(n, dtype=torch.float32)
    for s in range(0, n, 4096):
        sl = slice(s, s + 4096)
        truth = task.candidates(rows.gather(task.etype, true_ids[sl])).float()
        pos_t[sl] = pair_scores(model, anchors[torch.from_numpy(inv[sl])], truth)
    pos = pos_t.numpy()

    ge = np.zeros(n, np.int64)  # candidates (the true one included) scoring >= positive
    own = np.zeros(n, np.int64)  # 1 where the true entity itself was among them
    filt_ge = removed = frows = fcols = None
    if task.known is not None:
        frows, fcols = task.known(idx)
        keep = fcols != true_ids[frows]  # the positive itself is never filtered out
        frows, fcols = frows[keep], fcols[keep]
        removed = np.bincount(frows, minlength=n).astype(np.int64)
        filt_ge = np.zeros(n, np.int64)

    dups = np.flatnonzero(~is_first)
    q = max(1, min(chunk_size, num_anchors))
    anchor_starts = list(range(0, num_anchors, q))
    edge_bounds = [int(first[a]) for a in anchor_starts] + [n]
    score = _scorer(cmp, model.compute_dtype)
    anchors_np = anchors.numpy()
    buffer = np.empty(0, np.float32)
    for part in range(len(bases) - 1):
        lo, hi = int(bases[part]), int(bases[part + 1])
        if hi == lo:
            continue
        table = rows.source(task.etype, part)
        block = max(1, min(hi - lo, max_scores // q))
        if buffer.size < q * block:
            buffer = np.empty(q * block, np.float32)
        for b0 in range(0, hi - lo, block):
            cands = task.candidates(table[b0 : b0 + block]).float().contiguous().numpy()
            g0, g1 = lo + b0, lo + b0 + cands.shape[0]
            for ci, a0 in enumerate(anchor_starts):
                a1 = min(a0 + q, num_anchors)
                e0, e1 = edge_bounds[ci], edge_bounds[ci + 1]
                out = buffer[: (a1 - a0) * cands.shape[0]].reshape(a1 - a0, cands.shape[0])
                scores = score(anchors_np[a0:a1], cands, out)
                fe = first[a0:a1]
                ge[fe] += np.count_nonzero(scores >= pos[fe, None], axis=1)
                d0, d1 = np.searchsorted(dups, (e0, e1))
                if d1 > d0:
                    de = dups[d0:d1]
                    ge[de] += np.count_nonzero(scores[inv[de] - a0] >= pos[de, None], axis=1)
                te = true_ids[e0:e1]
                hit = np.flatnonzero((te >= g0) & (te < g1)) + e0
                if len(hit):
                    own[hit] += scores[inv[hit] - a0, true_ids[hit] - g0] >= pos[hit]
                if frows is not None and fcols is not None and filt_ge is not None:
                    f0, f1 = np.searchsorted(frows, (e0, e1))
                    fr, fc = frows[f0:f1], fcols[f0:f1]
                    m = (fc >= g0) & (fc < g1)
                    if m.any():
                        fr, fc = fr[m], fc[m]
                        hits = scores[inv[fr] - a0, fc - g0] >= pos[fr]
                        filt_ge[e0:e1] += np.bincount(fr[hits] - e0, minlength=e1 - e0)
                if progress:
                    progress((e1 - e0) * (g1 - g0) / num_candidates)
    raw = ge - own + 1
    return raw, filt_ge, removed


def _scorer(
    cmp: Comparator, dtype: torch.dtype = torch.float32
) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """``score(anchors (M, D), candidates (N, D), out (M, N))`` -> the comparator's scores,
    always written as fp32 into ``out``.

    In fp32, dot products (``dot``, and ``cos`` whose normalisation happened in ``prepare``) go
    straight to numpy's BLAS, which runs this shape faster than torch's matmul; other
    comparators use their own batched formula. In another compute dtype (bf16) the operands
    are rounded to it and torch multiplies them (fp32 accumulation inside the product); the
    scores are then upcast, so they are compared with the positives' fp32 scores: a candidate
    ties the true entity only when their scores are equal, not when both round to one bf16
    value.
    """
    if dtype == torch.float32 and isinstance(cmp, DotComparator):
        return lambda a, c, out: np.matmul(a, c.T, out=out)

    def generic(a: np.ndarray, c: np.ndarray, out: np.ndarray) -> np.ndarray:
        at, ct = torch.from_numpy(a).to(dtype), torch.from_numpy(c).to(dtype)
        if isinstance(cmp, DotComparator):
            res = torch.mm(at, ct.t())
        else:
            res = cmp.neg(at.unsqueeze(0), ct.unsqueeze(0))[0]
        torch.from_numpy(out).copy_(res)
        return out

    return generic
