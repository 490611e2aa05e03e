"""Known true edges, indexed for filtered ranking: (h, r) -> tails and (r, t) -> heads.

Everything is sorted numpy arrays and ``searchsorted``: no Python dict per edge, so it scales
to the sizes the rest of bigembed handles. Duplicate edges (the same edge in two edge sets, or
twice in one) are stored once, so a known edge is filtered out exactly once.
"""

from __future__ import annotations

import numpy as np


class _Index:
    """Sorted (key, value) pairs without duplicates; ``lookup`` lists the values of many keys."""

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        order = np.lexsort((values, keys))
        keys, values = keys[order], values[order]
        if len(keys) > 1:
            new = np.empty(len(keys), dtype=bool)
            new[0] = True
            np.not_equal(keys[1:], keys[:-1], out=new[1:])
            new[1:] |= values[1:] != values[:-1]
            keys, values = keys[new], values[new]
        self.keys = keys
        self.values = values

    def lookup(self, query_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, value) for every stored value of every query key, by position."""
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
    """All true edges of the given sets, in global entity ids (per entity type)."""

    def __init__(
        self, lhs: np.ndarray, rel: np.ndarray, rhs: np.ndarray, num_relations: int
    ) -> None:
        lhs, rel, rhs = (np.asarray(a, dtype=np.int64) for a in (lhs, rel, rhs))
        self.num_relations = max(int(num_relations), int(rel.max()) + 1 if len(rel) else 1)
        self._tails = _Index(lhs * self.num_relations + rel, rhs)
        self._heads = _Index(rhs * self.num_relations + rel, lhs)
        self.num_edges = len(self._tails.keys)  # distinct edges

    def true_tails(self, lhs: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, tail) for every known tail of each (lhs, rel) query."""
        return self._tails.lookup(np.asarray(lhs, np.int64) * self.num_relations + rel)

    def true_heads(self, rhs: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, head) for every known head of each (rel, rhs) query."""
        return self._heads.lookup(np.asarray(rhs, np.int64) * self.num_relations + rel)
