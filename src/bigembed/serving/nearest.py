"""Exact top-k over candidates that arrive block by block (partitions of a large entity type).

:class:`RunningTopK` keeps, for each query, the k best (score, id) pairs seen so far, so memory
is ``queries x (k + block)`` whatever the number of candidates. :func:`faiss_topk` does one
block with FAISS when it is installed (optional; same exact results, faster on many queries).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class RunningTopK:
    """The ``k`` highest scores per query row over all pushed blocks, with their ids."""

    def __init__(self, num_queries: int, k: int) -> None:
        self.k = k
        self.scores = torch.full((num_queries, 0), float("-inf"))
        self.ids = torch.empty((num_queries, 0), dtype=torch.long)

    def push(self, scores: Tensor, ids: Tensor) -> None:
        """``scores`` (Q, C) for candidates ``ids`` (C,) or (Q, C); -inf marks excluded ones."""
        if ids.dim() == 1:
            ids = ids.unsqueeze(0).expand(scores.shape[0], -1)
        all_scores = torch.cat((self.scores, scores.float()), dim=1)
        all_ids = torch.cat((self.ids, ids.long()), dim=1)
        k = min(self.k, all_scores.shape[1])
        best, where = torch.topk(all_scores, k, dim=1, sorted=True)
        self.scores = best
        self.ids = torch.gather(all_ids, 1, where)

    def result(self) -> list[list[tuple[int, float]]]:
        """Per query, (id, score) pairs best first, excluded candidates (-inf) left out."""
        out = []
        for s_row, i_row in zip(self.scores.tolist(), self.ids.tolist(), strict=True):
            out.append([(i, s) for i, s in zip(i_row, s_row, strict=True) if s != float("-inf")])
        return out


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_topk(
    queries: np.ndarray, candidates: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, offsets) of the k best candidates per query with a flat (exact) FAISS index.

    ``metric``: "dot" (inner product; normalise the inputs first for cosine) or "l2" (the
    returned score is minus the Euclidean distance, so higher is better as everywhere else).
    """
    import faiss

    dim = candidates.shape[1]
    index = faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim)
    index.add(np.ascontiguousarray(candidates, dtype=np.float32))
    k = min(k, candidates.shape[0])
    scores, offsets = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    if metric == "l2":
        scores = -np.sqrt(np.maximum(scores, 0))
    return scores, offsets
