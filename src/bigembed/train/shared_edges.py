"""The Hogwild pool's edge arrays: one shared-memory buffer reused by every bucket.

Sending a bucket's edges to the workers as fresh tensors costs, per bucket, a shared-memory
file per array (created, filled, then its descriptor passed to each worker and mapped there).
Instead the pool keeps one ``(3, capacity)`` int64 array (lhs, rhs, rel rows) and, once a
bucket has weights, a ``(capacity,)`` float32 array, in shared memory; each bucket's edges are
copied into its first ``n`` columns (in the order the workers will read them) and the workers
read those columns as views. A worker receives the arrays once (and again only when a larger
bucket replaced them, see :attr:`EdgeArrays.generation`), so a bucket's task carries only
``n``.

The pool writes the buffer only between buckets, while every worker is idle (it has replied
for the previous bucket), so no worker ever reads a half-written buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class EdgeArrays:
    """The shared arrays themselves (what travels to a worker, once per generation)."""

    ids: Tensor  # (3, capacity) int64: lhs, rhs, rel
    weight: Tensor | None  # (capacity,) float32, allocated the first time a bucket has weights
    generation: int

    def view(self, n: int, weighted: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The first ``n`` edges as (lhs, rhs, rel, weight) views."""
        assert n <= self.ids.shape[1], "the task's edge count exceeds the shared buffer"
        weight = None
        if weighted:
            assert self.weight is not None
            weight = self.weight[:n]
        return self.ids[0, :n], self.ids[1, :n], self.ids[2, :n], weight


class SharedEdges:
    """The owner side: fills the buffer for each bucket, replacing it when it is too small."""

    def __init__(self) -> None:
        self.arrays: EdgeArrays | None = None
        self._generation = 0

    def fill(
        self,
        lhs: Tensor,
        rhs: Tensor,
        rel: Tensor,
        weight: Tensor | None,
        order: Tensor | None = None,
    ) -> EdgeArrays:
        """Copy the edges (``order``: the permutation to apply first) into the buffer; returns
        the arrays (a new generation if they had to be replaced)."""
        n = int(lhs.shape[0])
        a = self.arrays
        if a is None or a.ids.shape[1] < n or (weight is not None and a.weight is None):
            capacity = max(n, 1) if a is None else max(n, a.ids.shape[1])
            self._generation += 1
            ids = torch.empty((3, capacity), dtype=torch.int64).share_memory_()
            w = None
            if weight is not None or (a is not None and a.weight is not None):
                w = torch.empty(capacity, dtype=torch.float32).share_memory_()
            a = self.arrays = EdgeArrays(ids, w, self._generation)
        for row, src in enumerate((lhs, rhs, rel)):
            out = a.ids[row, :n]
            if order is None:
                out.copy_(src)
            else:
                torch.index_select(src, 0, order, out=out)
        if weight is not None:
            assert a.weight is not None
            out_w = a.weight[:n]
            if order is None:
                out_w.copy_(weight)
            else:
                torch.index_select(weight, 0, order, out=out_w)
        return a
