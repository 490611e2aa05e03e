"""Top-k through an approximate index, for ``similar`` and ``predict``: the index proposes
candidates, the model rescores them exactly, exclusions are dropped.

A query asks the index for ``max(k + excluded, k x rerank)`` candidates (``excluded``: the most
candidates any query row must leave out: itself, known edges), rescores them with the exact
score and keeps the best ``k`` that are not excluded. With a flat index this is the exact
answer; with HNSW or IVF-PQ it misses only what the index did not propose.

``predict`` searches the index of the candidates' type with a vector that ranks them as the
model does (:func:`predict_queries`). The index holds each entity's vector ``z`` (stored row
plus global embedding); the model compares an anchor ``a`` with ``prepare(op(z))``, where
``op`` is the relation's operator on the predicted side (``rhs``, standard mode) or the
identity (``lhs``, or dynamic relations, whose operator is on the query side). So:

* ``dot``: ``a . op(z) = (J^T a) . z + a . op(0)`` for any affine operator (identity,
  translation, diagonal, linear, affine, complex_diagonal); the query is ``J^T a`` (a
  vector-Jacobian product), the constant does not change the ranking;
* ``cos``: needs ``op`` = identity (``prepare`` normalises after ``op``);
* ``l2``/``squared_l2``: needs ``op(z) = z + t`` (identity, translation); query ``a - t``.

Other cases (and ``bias``) are scanned exactly, with one line saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from bigembed.model import ScoringModel
from bigembed.serving.ann_build import metric_of
from bigembed.serving.ann_files import LoadedIndex
from bigembed.serving.nearest import RunningTopK

if TYPE_CHECKING:
    from bigembed.serving.model import EmbeddingModel

#: Exact scores ``(Q, F)`` of the candidates ``ids`` ``(Q, F)`` proposed for each query row.
Rescore = Callable[[np.ndarray], Tensor]


def approximate_top_k(
    ann: LoadedIndex,
    queries: Tensor,
    k: int,
    rescore: Rescore,
    exclude: tuple[np.ndarray, np.ndarray] | None,
) -> list[list[tuple[int, float]]]:
    """The ``k`` best (global id, exact score) per query row among the index's proposals;
    ``exclude`` = (query rows, global ids) that never count."""
    n = queries.shape[0]
    extra = 0
    if exclude is not None and len(exclude[0]):
        extra = int(np.bincount(exclude[0], minlength=n).max())
    fetch = max(k + extra, k * ann.rerank)
    ids = ann.search(queries.detach().numpy(), fetch)
    valid = ids >= 0
    safe = np.where(valid, ids, 0).astype(np.int64)
    scores = rescore(safe).float().clone()
    drop = ~valid
    if exclude is not None and len(exclude[0]):
        total = max(int(ann.info.count), 1)
        banned = exclude[0].astype(np.int64) * total + exclude[1].astype(np.int64)
        drop |= np.isin(np.arange(n, dtype=np.int64)[:, None] * total + safe, banned)
    scores[torch.from_numpy(drop)] = float("-inf")
    top = RunningTopK(n, k)
    top.push(scores, torch.from_numpy(safe))
    return top.result()


def predict_queries(
    model: ScoringModel, side: str, relation: int, anchors: Tensor, metric: str
) -> Tensor | None:
    """Vectors that rank the index's rows as ``predict`` ranks candidates (see the module
    docstring), or None when the index cannot serve this comparator and operator."""
    if model.dynamic or side == "lhs":
        return anchors
    op = model.rhs_operator(relation)
    dim = anchors.shape[1]
    probe = torch.randn(4, dim, generator=torch.Generator().manual_seed(0))
    shift = op(torch.zeros(1, dim))
    moved = op(probe) - shift
    if torch.allclose(moved, probe, atol=1e-6):  # z + t
        if metric == "cos":
            return anchors if not shift.any() else None
        return anchors - shift if metric == "l2" else anchors
    if metric != "dot":
        return None
    if not torch.allclose(op(probe[:2] + probe[2:]) - shift, moved[:2] + moved[2:], atol=1e-4):
        return None  # not affine
    with torch.enable_grad():
        z = torch.zeros_like(anchors, requires_grad=True)
        (adjoint,) = torch.autograd.grad(op(z), z, grad_outputs=anchors.detach())
    return adjoint.detach()


def index_predict(
    owner: EmbeddingModel,
    target: tuple[str, str, int],
    anchors: Tensor,
    candidates: Callable[[Tensor], Tensor],
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None,
) -> list[list[tuple[int, float]]] | None:
    """``predict``'s top-k through the index of the candidates' type; None (scan exactly)
    when there is no index or it cannot rank this relation's candidates. ``target``: (type,
    predicted side, relation) of the :class:`~bigembed.ranking.directions.Direction`, whose
    ``candidates`` prepares stored rows as the model compares them."""
    etype, side, relation = target
    ann = owner.indexes.get(etype)
    if ann is None:
        return None
    metric = metric_of(owner.trained)
    queries = None
    if metric == ann.info.metric:
        queries = predict_queries(owner.model, side, relation, anchors, metric)
    if queries is None:
        cfg = owner.trained.config
        owner.indexes.note(
            f"the {etype!r} index ({ann.info.metric}) cannot rank {side} predictions "
            f"of this model (comparator {cfg.comparator}{', bias' if cfg.bias else ''}, "
            f"relation {relation}'s operator); scanning every entity exactly"
        )
        return None

    def rescore(ids: np.ndarray) -> Tensor:
        rows = candidates(owner.tables.gather(etype, ids.reshape(-1)))
        prepared = rows.reshape(ids.shape[0], ids.shape[1], -1)
        return owner.model.comparator.neg(anchors.unsqueeze(1), prepared)[:, 0, :]

    return approximate_top_k(ann, queries, k, rescore, exclude)
