"""Choosing an IVF index's ``nprobe`` at build time: the smallest that reaches a recall target.

An IVF index visits ``nprobe`` of its ``nlist`` inverted lists per query: more lists, better
recall, slower queries. The right value depends on the table (how clustered it is), so
``bigembed index`` measures it rather than guessing: a sample of the table's own rows, held
out of the k-means training sample, is searched as queries (each row's own id left out, as
``similar`` leaves out the query entity), their exact top-k is computed while the rows are
added (:class:`TuningSample`), and :func:`tune_nprobe` searches for the smallest ``nprobe``
whose recall@k of the proposed candidates (the ``k x rerank`` the index hands to the exact
rescoring) reaches the target. Recall grows with ``nprobe`` (a superset of lists is visited),
so a doubling search followed by a bisection needs about ``2 log2(nlist)`` trial searches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bigembed.serving.nearest import RunningTopK, faiss_topk

#: recall@k is measured for this k (the ``similar``/``predict`` default).
TUNE_K = 10


def set_ivf_search(index: Any, nprobe: int) -> None:
    """Visit ``nprobe`` lists per query."""
    import faiss

    faiss.extract_index_ivf(index).nprobe = nprobe


class TuningSample:
    """Query rows (a sample of the table, by global id) and their exact top ``k + 1`` in the
    index's metric, accumulated block by block as the table is read."""

    def __init__(self, ids: np.ndarray, rows: np.ndarray, metric: str, k: int = TUNE_K) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.rows = np.ascontiguousarray(rows, dtype=np.float32)
        self.metric = metric
        self.k = k
        self._top = RunningTopK(len(self.ids), k + 1)  # + 1: the row itself

    def push(self, first_id: int, block: np.ndarray) -> None:
        """Candidates ``block`` (rows as indexed), global ids ``first_id, first_id + 1, ...``."""
        kind = "l2" if self.metric == "l2" else "dot"
        scores, offsets = faiss_topk(self.rows, block, self.k + 1, kind)
        self._top.push(torch.from_numpy(scores), torch.from_numpy(offsets + first_id))

    def truth(self) -> np.ndarray:
        """``(queries, k)`` exact neighbour ids of each query row, its own id left out."""
        return without_self(self._top.ids.numpy(), self.ids, self.k)

    def recall(self, proposed: np.ndarray) -> float:
        """Share of the exact top-k found among ``proposed`` ids (one row per query; the
        query's own id and -1 ignored)."""
        truth = self.truth()
        found = sum(
            len(set(t.tolist()) & set(p.tolist())) for t, p in zip(truth, proposed, strict=True)
        )
        return found / max(1, truth.size)


def without_self(ids: np.ndarray, own: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` ids of each row of ``ids`` other than that row's ``own`` id."""
    out = np.full((len(ids), width), -1, dtype=np.int64)
    for i, (row, me) in enumerate(zip(ids, own, strict=True)):
        kept = row[row != me][:width]
        out[i, : len(kept)] = kept
    return out


def tune_nprobe(
    index: Any,
    sample: TuningSample,
    nlist: int,
    fetch: int,
    target: float,
    said: Callable[[str], None] | None = None,
) -> tuple[int, float]:
    """The smallest ``nprobe`` whose recall on ``sample`` (``fetch`` candidates per query)
    reaches ``target``, and that recall; ``nlist`` and its recall when none does."""
    measured: dict[int, float] = {}

    def recall(nprobe: int) -> float:
        if nprobe not in measured:
            set_ivf_search(index, nprobe)
            _, ids = index.search(sample.rows, fetch + 1)
            measured[nprobe] = sample.recall(without_self(ids, sample.ids, fetch))
            if said is not None:
                said(f"nprobe {nprobe}: recall@{sample.k} {measured[nprobe]:.4f}")
        return measured[nprobe]

    hi = 1
    while hi < nlist and recall(hi) < target:
        hi = min(nlist, 2 * hi)
    if recall(hi) < target:
        return hi, measured[hi]
    lo = hi // 2  # fails (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if recall(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi, measured[hi]
