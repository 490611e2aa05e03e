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


def contiguous_batches(
    lhs: Tensor, rhs: Tensor, rel: Tensor, weight: Tensor | None, batch_size: int
) -> Iterator[Batch]:
    for start in range(0, lhs.shape[0], batch_size):
        sel = slice(start, start + batch_size)
        yield _take(lhs, rhs, rel, weight, sel, 0)


def relation_grouped_batches(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    batch_size: int,
    rng: np.random.Generator,
) -> Iterator[Batch]:
    """Single-relation batches, relation drawn with probability ∝ edges left."""
    rel_np = rel.numpy()
    order = np.argsort(rel_np, kind="stable")
    types, starts, counts = np.unique(rel_np[order], return_index=True, return_counts=True)
    cursor = np.zeros(len(types), dtype=np.int64)
    left = counts.astype(np.int64).copy()
    order_t = torch.from_numpy(order)
    while left.sum() > 0:
        k = int(rng.choice(len(types), p=left / left.sum()))
        take = int(min(batch_size, left[k]))
        begin = int(starts[k] + cursor[k])
        sel = order_t[begin : begin + take]
        cursor[k] += take
        left[k] -= take
        yield _take(lhs, rhs, rel, weight, sel, int(types[k]))


def make_batches(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    batch_size: int,
    dynamic: bool,
    rng: np.random.Generator,
) -> Iterator[Batch]:
    if dynamic:
        return contiguous_batches(lhs, rhs, rel, weight, batch_size)
    return relation_grouped_batches(lhs, rhs, rel, weight, batch_size, rng)
