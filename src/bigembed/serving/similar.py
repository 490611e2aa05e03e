"""Nearest entities by embedding, for :meth:`EmbeddingModel.similar`: to named entities (one
answer per name, the names of a type searched together) or to vectors given by the caller.

A query vector lives where :meth:`EmbeddingModel.vector` answers: the stored row plus the
type's global embedding. The candidates are compared in that space too, so
``similar(model.vector(x))`` and ``similar(x, include_self=True)`` give the same answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from bigembed.serving.ann_search import approximate_top_k
from bigembed.serving.errors import QueryError, UnknownNameError, check_name, show_values
from bigembed.serving.nearest import faiss_available
from bigembed.serving.search import exact_top_k, faiss_top_k, similarity

if TYPE_CHECKING:
    from bigembed.serving.model import EmbeddingModel, Prediction

logger = logging.getLogger(__name__)

METRICS = ("cos", "dot", "l2")


def as_vectors(query: object) -> np.ndarray | None:
    """``query`` as a float ``(n, dim)`` array when it is a vector or a matrix of them (a
    numpy array or a torch tensor of numbers), else None (names)."""
    if isinstance(query, Tensor):
        query = query.detach().cpu().numpy()
    if not isinstance(query, np.ndarray) or query.dtype.kind not in "fiu":
        return None
    if query.ndim not in (1, 2) or query.size == 0:
        raise QueryError(
            f"a query vector is 1-D (dim,) or a 2-D (n, dim) array, got shape {query.shape}"
        )
    vectors = np.asarray(query, dtype=np.float32).reshape(-1, query.shape[-1])
    if not np.isfinite(vectors).all():
        raise QueryError("a query vector holds NaN or infinite values")
    return vectors


def as_names(query: object) -> list[str]:
    """A list, tuple or array of names as a list of str (:class:`QueryError` otherwise)."""
    if isinstance(query, np.ndarray):
        query = query.tolist()
    if not isinstance(query, (list, tuple)):
        check_name(query)  # not a str either: "entity names are strings, got ..."
        raise QueryError(f"similar takes a name, a list of names or a vector, got {query!r}")
    return [check_name(n) for n in query]


def types_of(model: EmbeddingModel, names: list[str], etype: str | None) -> list[str]:
    """Each name's entity type (``etype`` for all when given or when there is one type);
    every unknown name is reported in one line, a few of them shown."""
    if etype is not None or len(model.entity_types) == 1:
        return [model._check_type(etype)] * len(names)
    found = [
        [t for t in model.entity_types if model.store.offset_of(t, n) is not None] for n in names
    ]
    unknown = [n for n, ts in zip(names, found, strict=True) if not ts]
    if unknown:
        what = f"entity {unknown[0]!r}" if len(unknown) == 1 else f"entities {show_values(unknown)}"
        raise UnknownNameError(f"unknown {what} (no entity type has it)")
    pairs = zip(names, found, strict=True)
    return [ts[0] if len(ts) == 1 else model._type_of(n, None) for n, ts in pairs]


def similar_to_names(
    model: EmbeddingModel,
    names: list[str],
    k: int,
    etype: str | None,
    metric: str,
    use_faiss: bool,
    include_self: bool,
    exact: bool = False,
) -> list[list[Prediction]]:
    """One answer per name; the names of one type are searched as one batch."""
    types = types_of(model, names, etype)
    out: list[list[Prediction]] = [[] for _ in names]
    for t in dict.fromkeys(types):
        rows = [i for i, ti in enumerate(types) if ti == t]
        ids = model._ids(t, [names[i] for i in rows])
        stored = model.tables.adjusted(t, model.tables.gather(t, ids))
        want = k if include_self else k + 1  # one more, then drop the query entity
        found = _search(model, stored, t, want, metric, use_faiss, exact)
        for row, own, best in zip(rows, ids.tolist(), found, strict=True):
            if not include_self:
                best = [(i, s) for i, s in best if i != own][:k]
            out[row] = model._predictions(t, best)
    return out


def similar_to_vectors(
    model: EmbeddingModel,
    vectors: np.ndarray,
    k: int,
    etype: str | None,
    metric: str,
    use_faiss: bool,
    exact: bool = False,
) -> list[list[Prediction]]:
    """One answer per row of ``vectors`` among the entities of ``etype`` (needed only when
    the model has several types); no entity is left out."""
    t = model._check_type(etype)
    dim = model.tables.dimension(t)
    if vectors.shape[1] != dim:
        raise QueryError(
            f"query vectors have {vectors.shape[1]} values but {t!r} embeddings have {dim}"
        )
    found = _search(model, torch.from_numpy(vectors), t, k, metric, use_faiss, exact)
    return [model._predictions(t, best) for best in found]


def _search(
    model: EmbeddingModel,
    queries: Tensor,
    etype: str,
    k: int,
    metric: str,
    use_faiss: bool,
    exact: bool,
) -> list[list[tuple[int, float]]]:
    """The k best (global id, score) per query row; ``queries`` are already adjusted (global
    embedding added), the candidates are adjusted block by block. Through ``bigembed
    index``'s index of ``etype`` when there is one of ``metric`` and not ``exact``."""

    def prep(x: Tensor) -> Tensor:
        x = model.tables.adjusted(etype, x)
        return torch.nn.functional.normalize(x, dim=-1) if metric == "cos" else x

    query = torch.nn.functional.normalize(queries, dim=-1) if metric == "cos" else queries
    ann = None if exact else model.indexes.get(etype)
    if ann is not None and ann.info.metric != metric:
        model.indexes.note(
            f"the {etype!r} index is for metric {ann.info.metric}, not {metric}; "
            "scanning every entity exactly"
        )
    elif ann is not None:

        def rescore(ids: np.ndarray) -> Tensor:
            rows = prep(model.tables.gather(etype, ids.reshape(-1))).reshape(*ids.shape, -1)
            if metric == "l2":
                return -torch.linalg.vector_norm(rows - query.unsqueeze(1), dim=-1)
            return (rows @ query.unsqueeze(-1))[..., 0]

        return approximate_top_k(ann, query, k, rescore, None)
    if use_faiss and not faiss_available():
        logger.warning("FAISS is not installed; using the exact torch search")
        use_faiss = False
    if use_faiss:
        kind = "l2" if metric == "l2" else "dot"
        return faiss_top_k(model.tables, query, etype, k, prep, kind)
    return exact_top_k(model.tables, query, etype, k, prep, similarity(metric), None)
