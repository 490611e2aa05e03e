"""Scoring a bucket's edges against sampled negatives, for ranking (not for training).

Both the withheld-edge eval of training (PBG's ``eval_fraction``) and the ``sampled`` protocol
of ``bigembed eval`` (what ``torchbiggraph_eval`` reports) cut a bucket's edges into batches as
training does and score each positive against the negatives training would use. The batch size
is rounded up to a multiple of ``num_batch_negs`` so every batch-negative chunk is full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from bigembed.buckets.batching import Batch, make_batches
from bigembed.buckets.gather import gather_side
from bigembed.buckets.metrics import RankingSums, ranks_and_auc
from bigembed.model.scoring import BatchScores, NegativeSettings, ScoringModel
from bigembed.partition_keys import BucketSides, PartitionKey


class EmbeddingTable(Protocol):
    """A loaded partition: anything with its embeddings as ``emb`` (N, D)."""

    emb: Tensor


def eval_batch_size(batch_size: int, negs: NegativeSettings) -> int:
    """``batch_size`` rounded up to a multiple of ``num_batch_negs`` (unchanged without them)."""
    if negs.num_batch_negs > 0:
        return -(-batch_size // negs.num_batch_negs) * negs.num_batch_negs
    return batch_size


@dataclass
class ScoredBatch:
    batch: Batch
    scores: BatchScores
    all_negs: bool  # the batch's relation ranks against all entities of the partition
    lhs_uniform: Tensor | None  # indices of the uniform negatives drawn for the lhs side
    rhs_uniform: Tensor | None


@torch.no_grad()
def score_batches(
    model: ScoringModel,
    embeddings: Callable[[PartitionKey], Tensor],
    sides: BucketSides,
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    negs: NegativeSettings,
    batch_size: int,
    gen: torch.Generator,
    rng: np.random.Generator,
) -> Iterator[ScoredBatch]:
    """Batches of one bucket's edges (offsets in its partitions) with their scores.

    ``embeddings`` gives a partition's embedding table; ``gen`` draws the uniform negatives and
    ``rng`` the relation order of the batches.
    """
    batches = make_batches(
        lhs, rhs, rel, weight, eval_batch_size(batch_size, negs), model.dynamic, rng
    )
    for batch in batches:
        lhs_key, rhs_key = sides[batch.relation_idx]
        all_negs = bool(model.relation_spec(batch.relation_idx).all_negs)
        ls, luni = gather_side(embeddings(lhs_key), batch.lhs, negs, all_negs, gen, None, False)
        rs, runi = gather_side(embeddings(rhs_key), batch.rhs, negs, all_negs, gen, None, False)
        scores = model(ls, rs, batch.rel, batch.relation_idx, batch.weight, negs)
        yield ScoredBatch(batch, scores, all_negs, luni, runi)


@torch.no_grad()
def evaluate_edges(
    model: ScoringModel,
    tables: Mapping[PartitionKey, EmbeddingTable],
    sides: BucketSides,
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    negs: NegativeSettings,
    batch_size: int,
    seed: int,
) -> RankingSums:
    """Rank each edge against its negatives on both sides; returns the summed metrics."""
    sums = RankingSums()
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for scored in score_batches(
        model, lambda key: tables[key].emb, sides, lhs, rhs, rel, weight, negs, batch_size, gen, rng
    ):
        scores = scored.scores
        sums.loss_sum += float(scores.loss)
        for pos, neg, enabled in (
            (scores.lhs_pos, scores.lhs_neg, not negs.disable_lhs),
            (scores.rhs_pos, scores.rhs_neg, not negs.disable_rhs),
        ):
            if enabled:
                sums.add_ranks(*ranks_and_auc(pos, neg))
    return sums
