"""Ranking metrics: ranks of positives among their candidates, and their summaries.

A positive's rank is 1 + the number of candidates scoring *at least* as high (ties count against
the positive, as PBG does). Masked candidates (score <= -1e9 / 2) never count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from bigembed.model.negatives import MASKED

HITS_AT = (1, 3, 10, 50)


def _blocks(neg: Tensor | Sequence[Tensor]) -> list[Tensor]:
    return [neg] if isinstance(neg, Tensor) else list(neg)


def ranks_from_scores(pos: Tensor, neg: Tensor | Sequence[Tensor]) -> Tensor:
    """``pos`` (B,), negatives (B, N) or blocks of it -> ranks (B,) as int64."""
    ranks = torch.ones(pos.shape[0], dtype=torch.long)
    p = pos.unsqueeze(1)
    for block in _blocks(neg):
        ranks += torch.count_nonzero(block >= p, dim=1)
    return ranks


def auc_from_scores(pos: Tensor, neg: Tensor | Sequence[Tensor]) -> Tensor:
    """Per positive: fraction of its (unmasked) negatives that score strictly below it."""
    below = torch.zeros(pos.shape[0])
    valid = torch.zeros(pos.shape[0])
    p = pos.unsqueeze(1)
    for block in _blocks(neg):
        ok = block > MASKED / 2
        below += ((block < p) & ok).sum(dim=1)
        valid += ok.sum(dim=1)
    return below / valid.clamp_min(1)


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
