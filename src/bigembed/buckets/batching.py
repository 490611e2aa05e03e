"""Cutting edges of one bucket into batches (a worker's share in training, or edges to rank).

Dynamic relations: contiguous batches of mixed relation types. Otherwise each batch holds one
relation type: pick a type with probability proportional to its edges left, take up to
``batch_size`` of them (PBG's rule, which keeps every type's edges spread over the pass).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    lhs: Tensor  # (B,) int64 offsets in the lhs partition
    rhs: Tensor  # (B,)
    rel: Tensor  # (B,) relation ids
    relation_idx: int  # the single relation of the batch (standard mode), else 0
    weight: Tensor | None  # (B,) float32 or None

    def __len__(self) -> int:
        return int(self.lhs.shape[0])


def _take(
    lhs: Tensor, rhs: Tensor, rel: Tensor, weight: Tensor | None, sel: Tensor | slice, ridx: int
) -> Batch:
    return Batch(lhs[sel], rhs[sel], rel[sel], ridx, None if weight is None else weight[sel])


def batch_plan(
    rel: Tensor, batch_size: int, dynamic: bool, rng: np.random.Generator
) -> tuple[Tensor | None, np.ndarray]:
    """The batches of some edges, planned ahead: ``(order, plan)``.

    ``plan`` is an ``(n_batches, 3)`` int64 array of ``(begin, end, relation_idx)``; batch ``k``
    is the edges ``order[begin:end]`` (``order`` ``None``: rows ``begin:end``). Dynamic relations:
    contiguous batches of mixed types (relation_idx 0). Otherwise single-relation batches, the
    relation drawn with probability ∝ its edges left (PBG's rule). Hogwild workers take the
    batches of one plan from a shared queue (:mod:`bigembed.train.hogwild`);
    :func:`make_batches` walks a plan in order.
    """
    n = int(rel.shape[0])
    if dynamic:
        starts = np.arange(0, n, batch_size, dtype=np.int64)
        plan = np.stack([starts, np.minimum(starts + batch_size, n), np.zeros_like(starts)], 1)
        return None, plan.reshape(-1, 3)
    rel_np = rel.numpy()
    order = np.argsort(rel_np, kind="stable")
    types, starts, counts = np.unique(rel_np[order], return_index=True, return_counts=True)
    cursor = np.zeros(len(types), dtype=np.int64)
    left = counts.astype(np.int64).copy()
    rows: list[tuple[int, int, int]] = []
    while left.sum() > 0:
        k = int(rng.choice(len(types), p=left / left.sum()))
        take = int(min(batch_size, left[k]))
        begin = int(starts[k] + cursor[k])
        cursor[k] += take
        left[k] -= take
        rows.append((begin, begin + take, int(types[k])))
    return torch.from_numpy(order), np.array(rows, dtype=np.int64).reshape(-1, 3)


def planned_batch(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    order: Tensor | None,
    row: np.ndarray | Tensor,
) -> Batch:
    """Batch ``row`` (one ``(begin, end, relation_idx)`` line of a :func:`batch_plan`)."""
    begin, end, ridx = (int(x) for x in row)
    sel: Tensor | slice = slice(begin, end) if order is None else order[begin:end]
    return _take(lhs, rhs, rel, weight, sel, ridx)


def make_batches(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    batch_size: int,
    dynamic: bool,
    rng: np.random.Generator,
) -> Iterator[Batch]:
    """All the batches of some edges, in :func:`batch_plan`'s order."""
    order, plan = batch_plan(rel, batch_size, dynamic, rng)
    for row in plan:
        yield planned_batch(lhs, rhs, rel, weight, order, row)
