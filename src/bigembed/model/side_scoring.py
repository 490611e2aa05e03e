"""The three ways one corrupted side of a batch is scored against its negatives.

* score blocks ``(B, N_k)`` (:func:`negative_score_blocks`): batch and uniform negatives, or
  every entity of the partition with ``all_negs``, for any comparator and loss (and for
  evaluation, which ranks the scores);
* the fused sampled loss (:func:`fused_side_loss`, :mod:`bigembed.model.fused`): loss and
  violators without score blocks, for dot-product comparators and the losses it implements;
* the tiled all-entity softmax (:func:`all_entities_side_loss`,
  :mod:`bigembed.model.all_entities`): 1-vs-all training.

:class:`~bigembed.model.scoring.ScoringModel` picks one per batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.model.all_entities import all_entity_softmax_loss
from bigembed.model.batch import Corruption, NegativeSettings
from bigembed.model.comparators import Comparator
from bigembed.model.fused import fused_sampled_loss
from bigembed.model.negatives import (
    batch_negative_scores,
    mask_positives,
    self_negative_scores,
    shared_negative_scores,
)


def negative_score_blocks(
    comparator: Comparator,
    dtype: torch.dtype,
    side: Corruption,
    negs: NegativeSettings,
    all_negs: bool,
) -> list[Tensor]:
    """Negative score blocks ``(B, N_k)`` for corrupting ``side.src`` against the anchors
    (the query-entity column last, when the side carries one)."""
    cmp, anchors = comparator, side.anchors
    batch = anchors.shape[0]
    if not side.enabled:
        return []
    if all_negs:
        assert side.whole is not None
        scores = shared_negative_scores(cmp, anchors, side.whole.unsqueeze(0), batch, dtype)
        return [mask_positives(scores, side.idx)]
    parts = []
    if negs.num_batch_negs > 0:
        parts.append(batch_negative_scores(cmp, anchors, side.src, negs.num_batch_negs, dtype))
    if side.uniform is not None and side.uniform.shape[1] > 0:
        parts.append(shared_negative_scores(cmp, anchors, side.uniform, negs.uniform_group, dtype))
    if side.self_rows is not None and side.self_mask is not None:
        parts.append(self_negative_scores(cmp, anchors, side.self_rows, side.self_mask, dtype))
    return parts


def fused_side_loss(
    side: Corruption,
    negs: NegativeSettings,
    weight: Tensor | None,
    dtype: torch.dtype,
    loss: str,
    margin: float,
) -> tuple[Tensor, int]:
    """Loss and violators of corrupting ``side.src`` against the anchors, without score
    blocks (needs uniform negatives)."""
    if not side.enabled:
        return side.pos.new_zeros(()), 0
    assert side.uniform is not None  # fusable: num_uniform_negs > 0
    return fused_sampled_loss(
        side.pos,
        side.anchors,
        side.uniform,
        negs.uniform_group,
        weight,
        dtype,
        side.src if negs.num_batch_negs > 0 else None,
        negs.num_batch_negs,
        loss,
        margin,
        side.self_rows,
        side.self_mask,
    )


def all_entities_side_loss(
    side: Corruption, weight: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, int]:
    """Loss and violators of corrupting a side with every entity of its partition (the tiled
    1-vs-all softmax of :mod:`bigembed.model.all_entities`)."""
    if not side.enabled:
        return side.anchors.new_zeros(()), 0
    assert side.whole is not None  # gather_side gathers the whole partition with all_negs
    return all_entity_softmax_loss(side.anchors, side.whole, side.idx, weight, dtype)
