"""Which edges of a bucket chunk training withholds for evaluation (PBG's ``eval_fraction``).

Each bucket chunk withholds the same edges every epoch (chosen by a generator seeded from the
edge set, chunk and bucket), never trains on them, and scores them before and after training
the bucket against ``eval_num_batch_negs`` batch and ``eval_num_uniform_negs`` uniform negatives
(:func:`bigembed.ranking.sampled.evaluate_edges`).
"""

from __future__ import annotations

import torch
from torch import Tensor


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
