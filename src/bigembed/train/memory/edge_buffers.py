"""A bucket's training edges, prepared for the Hogwild workers, in reusable shared buffers.

Preparing a bucket (reading its chunk, withholding the eval edges, shuffling, planning the
batches, putting the edges in plan order) happens before its training, in the edge read-ahead
thread while the previous bucket trains (:class:`bigembed.train.loop.TrainingLoop`). With
several workers the result is written into an :class:`EdgeBuffer` in shared memory that the
workers map once and keep (:mod:`bigembed.train.hogwild.cache`): two buffers are enough, one
for the bucket training and one for the bucket being prepared, so after the first buckets no
new shared memory is created or sent per bucket. A buffer grows (a new one, 25% larger) when a
bucket does not fit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: Buffers kept for reuse: the bucket training and the one being prepared.
KEEP = 2


@dataclass(eq=False)
class EdgeBuffer:
    """Room for ``capacity`` edges in shared memory (int64 ids, float32 weights if weighted)."""

    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None

    @classmethod
    def allocate(cls, capacity: int, weighted: bool) -> EdgeBuffer:
        def shared(dtype: torch.dtype) -> Tensor:
            return torch.empty(capacity, dtype=dtype).share_memory_()

        w = shared(torch.float32) if weighted else None
        return cls(shared(torch.int64), shared(torch.int64), shared(torch.int64), w)

    @property
    def capacity(self) -> int:
        return int(self.lhs.shape[0])


@dataclass(eq=False)
class PreparedEdges:
    """A bucket's training edges in the order the workers take them: ``lhs``, ``rhs``, ``rel``,
    ``weight`` (views of ``buffer`` when there is one), the batch ``plan`` (work stealing; see
    :func:`bigembed.buckets.batching.batch_plan`) and the bucket's ``seed``."""

    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None
    seed: int
    plan: np.ndarray | None = None
    buffer: EdgeBuffer | None = None
    #: with a plan and one worker: the plan rows to train, in the order they come (data-parallel
    #: replicas taking each other's batches, :mod:`bigembed.train.replica_claims`); else all
    claims: Iterable[int] | None = None

    @property
    def count(self) -> int:
        return int(self.lhs.shape[0])


class EdgeBuffers:
    """The free buffers; :meth:`fill` takes one (or allocates), :meth:`release` gives it back."""

    def __init__(self) -> None:
        self._free: list[EdgeBuffer] = []
        self._lock = threading.Lock()
        #: buffers allocated over the run (tests: reuse means this stops growing)
        self.allocated = 0

    def fill(
        self,
        edges: tuple[Tensor, Tensor, Tensor, Tensor | None],
        order: Tensor | None,
        seed: int,
        plan: np.ndarray | None,
    ) -> PreparedEdges:
        """Copy ``edges`` (taken in ``order`` if given) into a buffer. ``order`` may be longer
        than the edges: a grouped-query plan (KvsAll) takes every edge once per side."""
        n = int(edges[0].shape[0]) if order is None else int(order.shape[0])
        weighted = edges[3] is not None
        buffer = self._take(n, weighted)
        views: list[Tensor | None] = []
        dsts = (buffer.lhs, buffer.rhs, buffer.rel, buffer.weight)
        for src, dst in zip(edges, dsts, strict=True):
            if src is None or dst is None:
                views.append(None)
                continue
            out = dst[:n]
            if order is None:
                out.copy_(src)
            else:
                torch.index_select(src.to(out.dtype), 0, order, out=out)
            views.append(out)
        assert views[0] is not None and views[1] is not None and views[2] is not None
        return PreparedEdges(views[0], views[1], views[2], views[3], seed, plan, buffer)

    def _take(self, n: int, weighted: bool) -> EdgeBuffer:
        with self._lock:
            for k, buf in enumerate(self._free):
                if buf.capacity >= n and (buf.weight is not None) == weighted:
                    return self._free.pop(k)
            self.allocated += 1
        return EdgeBuffer.allocate(max(int(n * 1.25), 1), weighted)

    def release(self, edges: PreparedEdges) -> None:
        """The workers are done with ``edges``: its buffer may be filled again."""
        buffer, edges.buffer = edges.buffer, None
        if buffer is None:
            return
        with self._lock:
            self._free.append(buffer)
            if len(self._free) > KEEP:  # keep the largest ones
                self._free.sort(key=lambda b: b.capacity)
                del self._free[0]
