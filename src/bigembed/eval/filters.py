"""Known true edges, indexed for filtered ranking: (h, r) -> tails and (r, t) -> heads.

Everything is sorted numpy arrays and ``searchsorted``: no Python dict per edge, so it scales
to the sizes the rest of bigembed handles.
"""

from __future__ import annotations

import numpy as np


class _Index:
    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        order = np.lexsort((values, keys))
        self.keys = keys[order]
        self.values = values[order]

    def lookup(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, value) for every stored value of every query key."""
        lo = np.searchsorted(self.keys, query_keys, side="left")
        hi = np.searchsorted(self.keys, query_keys, side="right")
        lengths = hi - lo
        total = int(lengths.sum())
        rows = np.repeat(np.arange(len(query_keys)), lengths)
        if total == 0:
            return rows, np.empty(0, dtype=self.values.dtype)
        starts = np.repeat(lo - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        return rows, self.values[np.arange(total) + starts]


class KnownEdges:
    """All true edges of the given sets, in global entity ids."""

    def __init__(self, lhs: np.ndarray, rel: np.ndarray, rhs: np.ndarray, num_relations: int) -> None:
        self.num_relations = max(int(num_relations), int(rel.max()) + 1 if len(rel) else 1)
        lhs, rel, rhs = (np.asarray(a, dtype=np.int64) for a in (lhs, rel, rhs))
        self._tails = _Index(lhs * self.num_relations + rel, rhs)
        self._heads = _Index(rhs * self.num_relations + rel, lhs)

    def true_tails(self, lhs: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._tails.lookup(np.asarray(lhs, np.int64) * self.num_relations + rel)

    def true_heads(self, rhs: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._heads.lookup(np.asarray(rhs, np.int64) * self.num_relations + rel)
