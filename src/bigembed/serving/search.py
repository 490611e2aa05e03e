"""Top-k search over every entity of a type, block by block, so memory stays bounded.

The candidates are read one partition at a time from :class:`~bigembed.checkpoints.EntityTables`
in blocks of at most :data:`MAX_SCORES` scores; a running top-k keeps the best of each query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from bigembed.checkpoints import EntityTables
from bigembed.serving.nearest import RunningTopK, faiss_topk

MAX_SCORES = 1 << 24  # floats in one block of scores

#: Rows of candidates as compared: global embedding, operator, normalisation.
Prepare = Callable[[Tensor], Tensor]
#: The ``(queries, candidates)`` score matrix of prepared rows.
ScoreFn = Callable[[Tensor, Tensor], Tensor]


def candidate_blocks(
    tables: EntityTables, etype: str, queries: int
) -> Iterator[tuple[int, Tensor]]:
    """(global first id, stored rows) of candidate blocks small enough for the budget."""
    bases = tables.bases(etype)
    block = max(1, MAX_SCORES // max(1, queries))
    for part in range(len(bases) - 1):
        lo, hi = int(bases[part]), int(bases[part + 1])
        if hi == lo:
            continue
        table = tables.table(etype, part)
        for b0 in range(0, hi - lo, block):
            yield lo + b0, table[b0 : b0 + block]


def exact_top_k(
    tables: EntityTables,
    anchors: Tensor,
    etype: str,
    k: int,
    prepare: Prepare,
    score_fn: ScoreFn,
    exclude: tuple[np.ndarray, np.ndarray] | None,
) -> list[list[tuple[int, float]]]:
    """The ``k`` best (global id, score) of each anchor; ``exclude`` = (query rows, global
    ids) that never count."""
    top = RunningTopK(anchors.shape[0], k)
    for g0, rows in candidate_blocks(tables, etype, anchors.shape[0]):
        scores = score_fn(anchors, prepare(rows)).float()
        g1 = g0 + rows.shape[0]
        if exclude is not None:
            qrow, col = exclude
            m = (col >= g0) & (col < g1)
            if m.any():
                scores[torch.from_numpy(qrow[m]), torch.from_numpy(col[m] - g0)] = float("-inf")
        top.push(scores, torch.arange(g0, g1))
    return top.result()


def faiss_top_k(
    tables: EntityTables, query: Tensor, etype: str, k: int, prepare: Prepare, kind: str
) -> list[list[tuple[int, float]]]:
    """:func:`exact_top_k` with FAISS searching each block (``kind``: "dot" or "l2")."""
    top = RunningTopK(query.shape[0], k)
    for g0, rows in candidate_blocks(tables, etype, query.shape[0]):
        scores, offsets = faiss_topk(query.numpy(), prepare(rows).numpy(), k, kind)
        top.push(torch.from_numpy(scores), torch.from_numpy(offsets + g0))
    return top.result()


def similarity(metric: str) -> ScoreFn:
    """The score of ``similar``'s ``metric``: minus the Euclidean distance for "l2", the inner
    product otherwise (of normalised rows for "cos")."""

    def dot(a: Tensor, c: Tensor) -> Tensor:
        return a @ c.T

    def l2(a: Tensor, c: Tensor) -> Tensor:
        # the exact formula: an entity's distance to itself is 0, not rounding noise
        return -torch.cdist(a, c, compute_mode="donot_use_mm_for_euclid_dist")

    return l2 if metric == "l2" else dot
