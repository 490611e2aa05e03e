"""Featurized entities: an entity's embedding is the weighted mean of its features' rows.

A featurized type's embedding table is its *feature* table; :class:`FeatureBags` holds the
bags (a CSR: offsets, feature ids, weights that sum to 1 per bag) and turns rows of the feature
table into entity rows (:meth:`FeatureBags.mean`, an ``embedding_bag`` sum with the normalised
weights) and entity-row gradients into feature-row gradients (:meth:`FeatureBags.feature_grads`,
the exact backward of that sum). The trainer gathers entity rows as leaf tensors as for any
type, so every negative mode, operator and loss works unchanged; only the final row update is
routed to the feature rows. An entity with no features has the zero embedding and no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class FeatureBags:
    """The bags of one partition of a featurized type (see the module docstring)."""

    offsets: Tensor  # int64 (count + 1,)
    features: Tensor  # int64 (nnz,)
    weights: Tensor  # float32 (nnz,), each non-empty bag sums to 1

    @classmethod
    def from_arrays(
        cls, offsets: np.ndarray, features: np.ndarray, weights: np.ndarray
    ) -> FeatureBags:
        return cls(
            torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(features, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32)),
        )

    @classmethod
    def from_lists(
        cls, bags: Sequence[Sequence[int]], weights: Sequence[Sequence[float]] | None = None
    ) -> FeatureBags:
        """Bags given as lists of feature ids (and optional raw weights, normalised here)."""
        lengths = [len(b) for b in bags]
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        feats = np.array([f for b in bags for f in b], dtype=np.int64)
        if weights is None:
            raw = np.ones(len(feats), dtype=np.float64)
        else:
            raw = np.array([w for ws in weights for w in ws], dtype=np.float64)
        return cls.from_arrays(offsets, feats, normalise_bag_weights(offsets, raw))

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def share_memory_(self) -> FeatureBags:
        for t in (self.offsets, self.features, self.weights):
            t.share_memory_()
        return self

    def _select(self, idx: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(positions into ``features``, bag offsets, bag of each position) of bags ``idx``."""
        if idx is None:
            starts = self.offsets[:-1]
            total = int(self.features.shape[0])
            positions = torch.arange(total)
            ends = self.offsets[1:]
        else:
            idx = idx.long()
            first = self.offsets.index_select(0, idx)
            ends = torch.cumsum(self.offsets.index_select(0, idx + 1) - first, 0)
            total = int(ends[-1]) if ends.numel() else 0
            starts = ends - (self.offsets.index_select(0, idx + 1) - first)
            positions = None
        # the bag of each position: how many bags end at or before it
        bag_of = torch.searchsorted(ends, torch.arange(total), right=True)
        if positions is None:
            positions = torch.arange(total) + (first - starts).index_select(0, bag_of)
        return positions, starts, bag_of

    def mean(self, table: Tensor, idx: Tensor | None = None) -> Tensor:
        """The entity rows of bags ``idx`` (all bags when None): the weighted mean of their
        features' rows of ``table`` (no gradient is recorded)."""
        positions, starts, _ = self._select(idx)
        with torch.no_grad():
            return F.embedding_bag(
                self.features.index_select(0, positions),
                table,
                starts,
                mode="sum",
                per_sample_weights=self.weights.index_select(0, positions).to(table.dtype),
            )

    def feature_grads(self, idx: Tensor | None, grad: Tensor) -> tuple[Tensor, Tensor]:
        """The gradient of the feature rows given ``grad`` on the entity rows of bags ``idx``
        (all bags when None), as (feature ids, rows): each feature gets its weight times its
        bag's gradient (duplicates are summed by the row update)."""
        positions, _, bag_of = self._select(idx)
        w = self.weights.index_select(0, positions).to(grad.dtype).unsqueeze(1)
        return self.features.index_select(0, positions), grad.index_select(0, bag_of) * w


def normalise_bag_weights(offsets: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Weights divided by their bag's sum (float32)."""
    lengths = np.diff(offsets)
    sums = np.add.reduceat(raw, offsets[:-1][lengths > 0]) if len(raw) else np.zeros(0)
    per_bag = np.ones(len(lengths))
    per_bag[lengths > 0] = sums
    return (raw / np.repeat(per_bag, lengths)).astype(np.float32)
