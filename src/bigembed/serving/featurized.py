"""Embeddings of entities given by their features (featurized types, docs/featurized.md).

An entity of a featurized type need not have been seen in training: its embedding is the
weighted mean of its features' trained rows, like any entity of the type. Features the model
does not know (absent from the import's feature dictionary) are ignored; a bag with no known
feature is an error naming its features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from bigembed.model import FeatureBags
from bigembed.ranking import direction
from bigembed.serving.errors import QueryError, UnknownNameError
from bigembed.serving.search import exact_top_k

if TYPE_CHECKING:
    from bigembed.serving.model import EmbeddingModel, Prediction

FeatureQuery = Sequence[str] | Sequence[Sequence[str]]


def _bags(features: FeatureQuery) -> tuple[list[list[str]], bool]:
    """The query as bags, and whether it was one bag (a flat list of feature names)."""
    if isinstance(features, str):
        raise QueryError("features: give a list of feature names, not one string")
    items = list(features)
    if items and all(isinstance(f, str) for f in items):
        return [[str(f) for f in items]], True
    return [[str(f) for f in bag] for bag in items], False


def featurized_type(model: EmbeddingModel, type: str | None) -> str:
    """The featurized type a feature query is about (``type`` may be left out if only one)."""
    types = [t for t in model.entity_types if model.trained.is_featurized(t)]
    if type is None:
        if len(types) != 1:
            raise QueryError(
                f"the model has {len(types)} featurized entity types "
                f"({', '.join(types) or 'none'}); pass type="
            )
        return types[0]
    model._check_type(type)
    if type not in types:
        raise QueryError(f"entity type {type!r} is not featurized (featurized: {types or 'none'})")
    return type


def feature_embeddings(
    model: EmbeddingModel,
    features: FeatureQuery,
    weights: Sequence[float] | Sequence[Sequence[float]] | None,
    type: str | None,
) -> tuple[str, Tensor, bool]:
    """(type, raw entity rows (bags x dim, no global embedding), one bag?) of a query."""
    etype = featurized_type(model, type)
    bags, single = _bags(features)
    if weights is None:
        bag_weights = [[1.0] * len(b) for b in bags]
    else:
        bag_weights = [[float(w) for w in weights]] if single else [list(w) for w in weights]  # type: ignore[arg-type]
    if len(bag_weights) != len(bags) or any(
        len(w) != len(b) for w, b in zip(bag_weights, bags, strict=True)
    ):
        raise QueryError("weights: one weight per feature, in the same shape as features")
    if any(w <= 0 for ws in bag_weights for w in ws):
        raise QueryError("weights: must be positive")
    ids = model._feature_ids(etype)
    known_bags, known_weights = [], []
    for bag, ws in zip(bags, bag_weights, strict=True):
        kept = [(ids[f], w) for f, w in zip(bag, ws, strict=True) if f in ids]
        if not kept:
            raise UnknownNameError(f"none of the features {bag} is known to the model ({etype!r})")
        known_bags.append([i for i, _ in kept])
        known_weights.append([w for _, w in kept])
    table = torch.from_numpy(np.array(model.trained.feature_rows(etype), dtype=np.float32))
    rows = FeatureBags.from_lists(known_bags, known_weights).mean(table)
    max_norm = model.trained.config.max_norm
    if max_norm is not None:
        norms = rows.norm(dim=1, keepdim=True)
        rows.mul_((max_norm / norms.clamp_min(1e-7)).clamp_max(1.0))
    return etype, rows, single


@torch.no_grad()
def predict_from_features(
    model: EmbeddingModel,
    features: FeatureQuery,
    rel: str | int,
    k: int,
    side: str,
    weights: Sequence[float] | Sequence[Sequence[float]] | None,
    type: str | None,
) -> list[Prediction] | list[list[Prediction]]:
    """:meth:`EmbeddingModel.predict` for entities given by their features."""
    if side not in ("lhs", "rhs"):
        raise QueryError(f"side must be 'lhs' or 'rhs', not {side!r}")
    etype, rows, single = feature_embeddings(model, features, weights, type)
    ridx = model._relation_id(rel)
    d = direction(model.model, side, 0 if model.model.dynamic else ridx)
    if d.source_type != etype:
        raise QueryError(
            f"relation {rel!r} ({side} side) starts from {d.source_type!r}, not {etype!r}"
        )
    rel_ids = torch.full((rows.shape[0],), ridx, dtype=torch.long)
    anchors = d.anchors(rows, rel_ids)
    top = exact_top_k(model.tables, anchors, d.target_type, k, d.candidates, model._pairwise, None)
    found = [model._predictions(d.target_type, best) for best in top]
    return found[0] if single else found
