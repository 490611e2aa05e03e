"""Ranking eval of withheld edges during training (PBG's ``eval_fraction``).

Each bucket chunk withholds the same edges every epoch (chosen by a generator seeded from the
edge set, chunk and bucket), never trains on them, and scores them before and after training
the bucket against ``eval_num_batch_negs`` batch and ``eval_num_uniform_negs`` uniform negatives.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from bigembed.eval.metrics import RankingSums, auc_from_scores, ranks_from_scores
from bigembed.model.scoring import NegativeSettings, ScoringModel
from bigembed.train.batching import make_batches
from bigembed.train.step import Table, gather_side


def split_eval(num_edges: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """(eval indices, train indices) of a chunk; the eval set depends only on ``seed``."""
    k = int(fraction * num_edges)
    if k <= 0:
        return torch.empty(0, dtype=torch.long), torch.arange(num_edges)
    perm = torch.randperm(num_edges, generator=torch.Generator().manual_seed(seed))
    eval_idx = perm[:k].sort().values
    keep = torch.ones(num_edges, dtype=torch.bool)
    keep[eval_idx] = False
    return eval_idx, keep.nonzero().squeeze(1)


@torch.no_grad()
def evaluate_edges(
    model: ScoringModel,
    tables: dict[tuple[str, int], Table],
    sides: list[tuple[tuple[str, int], tuple[str, int]]],
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
    for batch in make_batches(lhs, rhs, rel, weight, batch_size, model.dynamic, rng):
        lhs_key, rhs_key = sides[batch.relation_idx]
        all_negs = bool(model.relation_config(batch.relation_idx).all_negs)
        ls, _ = gather_side(tables[lhs_key], batch.lhs, negs, all_negs, gen, None, grad=False)
        rs, _ = gather_side(tables[rhs_key], batch.rhs, negs, all_negs, gen, None, grad=False)
        scores = model(ls, rs, batch.rel, batch.relation_idx, batch.weight, negs)
        sums.loss_sum += float(scores.loss)
        for pos, neg, enabled in (
            (scores.lhs_pos, scores.lhs_neg, not negs.disable_lhs),
            (scores.rhs_pos, scores.rhs_neg, not negs.disable_rhs),
        ):
            if enabled:
                sums.add_ranks(ranks_from_scores(pos, neg), auc_from_scores(pos, neg))
    return sums
