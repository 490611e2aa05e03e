"""Cutting edges of one bucket into batches (a worker's share in training, or edges to rank).

Dynamic relations: contiguous batches of mixed relation types. Otherwise each batch holds one
relation type: pick a type with probability proportional to its edges left, take up to
``batch_size`` of them (PBG's rule, which keeps every type's edges spread over the pass).

Grouped queries (``train_type: KvsAll``, dynamic relations): every edge is planned twice, once
among the tail queries ``(h, r, ?)`` and once among the head queries ``(?, r, t)``. Each side's
edges are ordered query by query (queries in random order, a query's edges contiguous) and cut
into batches of ``batch_size`` edges that train that side only; the batches of both sides are
then shuffled together. Edges sharing a query in a batch share one score row.
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
    side: str = "both"  # the corrupted side(s): "both", or "lhs"/"rhs" for grouped queries

    def __len__(self) -> int:
        return int(self.lhs.shape[0])


#: The corrupted side(s) of a batch, by the code in a plan's last column.
PLAN_SIDES = ("both", "lhs", "rhs")


def _take(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    sel: Tensor | slice,
    ridx: int,
    side: int = 0,
) -> Batch:
    w = None if weight is None else weight[sel]
    return Batch(lhs[sel], rhs[sel], rel[sel], ridx, w, PLAN_SIDES[side])


def _query_plan(
    lhs: Tensor, rhs: Tensor, rel: Tensor, batch_size: int, rng: np.random.Generator
) -> tuple[Tensor, np.ndarray]:
    """The grouped-query plan (module docstring): ``order`` lists every edge twice."""
    n = int(rel.shape[0])
    nrel = int(rel.max()) + 1 if n else 1
    orders, rows = [], []
    # Tail queries (h, r, ?) predict (corrupt) the rhs, head queries (?, r, t) the lhs.
    for half, (code, given) in enumerate(
        ((PLAN_SIDES.index("rhs"), lhs), (PLAN_SIDES.index("lhs"), rhs))
    ):
        _, query = np.unique(given.numpy() * nrel + rel.numpy(), return_inverse=True)
        rank = rng.permutation(int(query.max()) + 1 if n else 0)
        orders.append(np.argsort(rank[query], kind="stable"))
        starts = np.arange(0, n, batch_size, dtype=np.int64) + half * n
        ends = np.minimum(starts + batch_size, (half + 1) * n)
        rows.append(np.stack([starts, ends, np.zeros_like(starts), np.full_like(starts, code)], 1))
    plan = np.concatenate(rows).reshape(-1, 4)
    return torch.from_numpy(np.concatenate(orders)), plan[rng.permutation(len(plan))]


def batch_plan(
    rel: Tensor,
    batch_size: int,
    dynamic: bool,
    rng: np.random.Generator,
    queries: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, np.ndarray]:
    """The batches of some edges, planned ahead: ``(order, plan)``.

    ``plan`` is an ``(n_batches, 4)`` int64 array of ``(begin, end, relation_idx, side)``; batch
    ``k`` is the edges ``order[begin:end]`` (``order`` ``None``: rows ``begin:end``) and trains
    the side(s) ``PLAN_SIDES[side]``. Dynamic relations: contiguous batches of mixed types
    (relation_idx 0). Otherwise single-relation batches, the relation drawn with probability ∝
    its edges left (PBG's rule). ``queries`` = the edges' ``(lhs, rhs)``: the grouped-query plan
    of the module docstring (dynamic relations). Hogwild workers take the batches of one plan
    from a shared queue (:mod:`bigembed.train.hogwild.pool`); :func:`make_batches` walks a plan in
    order.
    """
    n = int(rel.shape[0])
    if queries is not None:
        return _query_plan(*queries, rel, batch_size, rng)
    if dynamic:
        starts = np.arange(0, n, batch_size, dtype=np.int64)
        zeros = np.zeros_like(starts)
        plan = np.stack([starts, np.minimum(starts + batch_size, n), zeros, zeros], 1)
        return None, plan.reshape(-1, 4)
    rel_np = rel.numpy()
    order = np.argsort(rel_np, kind="stable")
    types, starts, counts = np.unique(rel_np[order], return_index=True, return_counts=True)
    cursor = np.zeros(len(types), dtype=np.int64)
    left = counts.astype(np.int64).copy()
    rows: list[tuple[int, int, int, int]] = []
    while left.sum() > 0:
        k = int(rng.choice(len(types), p=left / left.sum()))
        take = int(min(batch_size, left[k]))
        begin = int(starts[k] + cursor[k])
        cursor[k] += take
        left[k] -= take
        rows.append((begin, begin + take, int(types[k]), 0))
    return torch.from_numpy(order), np.array(rows, dtype=np.int64).reshape(-1, 4)


def planned_batch(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    order: Tensor | None,
    row: np.ndarray | Tensor,
) -> Batch:
    """Batch ``row`` (one ``(begin, end, relation_idx, side)`` line of a :func:`batch_plan`)."""
    begin, end, ridx, side = (int(x) for x in row)
    sel: Tensor | slice = slice(begin, end) if order is None else order[begin:end]
    return _take(lhs, rhs, rel, weight, sel, ridx, side)


def make_batches(
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    batch_size: int,
    dynamic: bool,
    rng: np.random.Generator,
    group_queries: bool = False,
) -> Iterator[Batch]:
    """All the batches of some edges, in :func:`batch_plan`'s order (``group_queries``: its
    grouped-query plan)."""
    queries = (lhs, rhs) if group_queries else None
    order, plan = batch_plan(rel, batch_size, dynamic, rng, queries)
    for row in plan:
        yield planned_batch(lhs, rhs, rel, weight, order, row)
