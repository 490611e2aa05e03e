"""Ranking metrics: ranks of positives among their candidates, and their summaries.

A positive's rank is 1 + the number of candidates scoring *at least* as high (ties count against
the positive, as PBG does). Masked candidates (score <= -1e9 / 2) never count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from bigembed.model.negatives import MASKED

HITS_AT = (1, 3, 10, 50)


def ranks_from_scores(pos: Tensor, neg: Tensor) -> Tensor:
    """``pos`` (B,), ``neg`` (B, N) -> ranks (B,) as int64."""
    if neg.numel() == 0:
        return torch.ones(pos.shape[0], dtype=torch.long)
    return (neg >= pos.unsqueeze(1)).sum(dim=1).add_(1)


def auc_from_scores(pos: Tensor, neg: Tensor) -> Tensor:
    """Per positive: fraction of its (unmasked) negatives that score strictly below it."""
    valid = neg > MASKED / 2
    below = ((neg < pos.unsqueeze(1)) & valid).sum(dim=1).float()
    return below / valid.sum(dim=1).clamp_min(1).float()


@dataclass
class RankingSums:
    """Additive accumulator, so per-bucket and per-relation results can be merged exactly."""

    count: int = 0
    rank_sum: float = 0.0
    rr_sum: float = 0.0
    hits1: int = 0
    hits3: int = 0
    hits10: int = 0
    hits50: int = 0
    auc_sum: float = 0.0
    loss_sum: float = 0.0

    def add_ranks(self, ranks: Tensor, auc: Tensor | None = None) -> None:
        r = ranks.double()
        self.count += int(ranks.numel())
        self.rank_sum += float(r.sum())
        self.rr_sum += float(r.reciprocal().sum())
        self.hits1 += int((ranks <= 1).sum())
        self.hits3 += int((ranks <= 3).sum())
        self.hits10 += int((ranks <= 10).sum())
        self.hits50 += int((ranks <= 50).sum())
        if auc is not None:
            self.auc_sum += float(auc.double().sum())

    def merge(self, other: RankingSums) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def summary(self) -> dict[str, float]:
        n = max(self.count, 1)
        return {
            "count": self.count,
            "mr": self.rank_sum / n,
            "mrr": self.rr_sum / n,
            "hits@1": self.hits1 / n,
            "hits@3": self.hits3 / n,
            "hits@10": self.hits10 / n,
            "hits@50": self.hits50 / n,
            "auc": self.auc_sum / n,
            "loss": self.loss_sum / n,
        }
