"""Ranking metrics: ranks of positives among their candidates, and their summaries.

A positive's rank is 1 + the number of candidates scoring *at least* as high (ties count against
the positive, as PBG does). Masked candidates (score <= -1e9 / 2) never count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from bigembed.model import MASKED

HITS_AT = (1, 3, 10, 50)


def _blocks(neg: Tensor | Sequence[Tensor]) -> list[Tensor]:
    return [neg] if isinstance(neg, Tensor) else list(neg)


def _blocks_counts(
    pos: Tensor, neg: Tensor | Sequence[Tensor], valid: bool
) -> tuple[Tensor, Tensor | None]:
    """(count of negatives scoring >= pos, count of unmasked negatives if ``valid``) per row,
    as float64 whole numbers.

    Each comparison is written into a float buffer (one, reused by every block) and summed as
    floats: faster than summing a bool tensor (which converts it to int64
    first), and exact (float32 sums whole numbers exactly below 2**24; wider rows use float64).
    """
    p = pos.unsqueeze(1)
    ge = torch.zeros(pos.shape[0], dtype=torch.float64)
    ok = torch.zeros(pos.shape[0], dtype=torch.float64) if valid else None
    blocks = _blocks(neg)
    wide = any(b.shape[-1] >= 1 << 24 for b in blocks)
    flat = torch.empty(
        max((b.numel() for b in blocks), default=0), dtype=torch.float64 if wide else torch.float32
    )
    for block in blocks:
        buf = flat[: block.numel()].view(block.shape)
        ge += torch.ge(block, p, out=buf).sum(dim=1)
        if ok is not None:
            ok += torch.gt(block, MASKED / 2, out=buf).sum(dim=1)
    return ge, ok


def ranks_from_scores(pos: Tensor, neg: Tensor | Sequence[Tensor]) -> Tensor:
    """``pos`` (B,), negatives (B, N) or blocks of it -> ranks (B,) as int64."""
    ge = _blocks_counts(pos, neg, False)[0]
    rows = _odd_rows(pos)
    if rows is not None:
        ge[rows] = _counts_slow(pos[rows], [b[rows] for b in _blocks(neg)])[0]
    return ge.long() + 1


def _odd_rows(pos: Tensor) -> Tensor | None:
    """Rows whose positive is NaN or as low as a mask (a diverged model): there a masked
    negative can score >= the positive, so the one-pass counts would include it."""
    odd = ~(pos > MASKED / 2)
    return odd.nonzero().squeeze(1) if bool(odd.any()) else None


def _counts_slow(pos: Tensor, neg: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(unmasked negatives >= pos, unmasked negatives < pos, unmasked negatives) per row."""
    at_least = torch.zeros(pos.shape[0], dtype=torch.float64)
    below = torch.zeros(pos.shape[0])  # float32, as the fast path's AUC
    valid = torch.zeros(pos.shape[0])
    p = pos.unsqueeze(1)
    for block in neg:
        ok = block > MASKED / 2
        at_least += ((block >= p) & ok).sum(dim=1)
        below += ((block < p) & ok).sum(dim=1)
        valid += ok.sum(dim=1)
    return at_least, below, valid


def ranks_and_auc(
    pos: Tensor, neg: Tensor | Sequence[Tensor], unmasked: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`ranks_from_scores` and :func:`auc_from_scores` at once, in two comparison passes
    over the scores instead of six: for a positive that is neither masked nor NaN, an unmasked
    negative scores either >= it (counted in its rank) or below it, so "below" is "unmasked"
    minus "at least as high". Other rows (none in practice) are computed the long way.

    ``unmasked``: the count of unmasked negatives of each row (float64), when the caller knows
    it (no score NaN or as low as a mask): one comparison pass instead of two."""
    ge, ok = _blocks_counts(pos, neg, unmasked is None)
    if unmasked is not None:
        ok = unmasked
    assert ok is not None
    auc = (ok - ge).float() / ok.float().clamp_min(1)
    rows = _odd_rows(pos)
    if rows is not None:
        at_least, below, valid = _counts_slow(pos[rows], [b[rows] for b in _blocks(neg)])
        ge[rows] = at_least
        auc[rows] = below / valid.clamp_min(1)
    return ge.long() + 1, auc


def auc_from_scores(pos: Tensor, neg: Tensor | Sequence[Tensor]) -> Tensor:
    """Per positive: fraction of its (unmasked) negatives that score strictly below it."""
    return ranks_and_auc(pos, neg)[1]


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


METRIC_KEYS = ("count", "mr", "mrr", "hits@1", "hits@3", "hits@10", "hits@50", "auc")


def summarize(ranks: np.ndarray, auc: np.ndarray | None = None) -> dict[str, float]:
    """MR, MRR, Hits@k and mean AUC of a set of ranks (numpy), as :data:`METRIC_KEYS`."""
    (row,) = summarize_groups(ranks, auc, np.zeros(len(ranks), np.int64), 1)
    return row


def summarize_groups(
    ranks: np.ndarray, auc: np.ndarray | None, groups: np.ndarray, num_groups: int
) -> list[dict[str, float]]:
    """:func:`summarize` of each group (e.g. relation) at once, vectorised with bincount."""
    ranks = np.asarray(ranks, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    count = np.bincount(groups, minlength=num_groups)
    n = np.maximum(count, 1)
    sums = {
        "mr": np.bincount(groups, ranks, num_groups),
        "mrr": np.bincount(groups, 1.0 / np.maximum(ranks, 1), num_groups),
        **{
            f"hits@{k}": np.bincount(groups, (ranks <= k).astype(np.float64), num_groups)
            for k in HITS_AT
        },
        "auc": np.bincount(groups, np.asarray(auc, np.float64), num_groups)
        if auc is not None
        else np.full(num_groups, np.nan),
    }
    out = []
    for g in range(num_groups):
        row: dict[str, float] = {"count": int(count[g])}
        for key in METRIC_KEYS[1:]:
            row[key] = float(sums[key][g] / n[g])
        out.append(row)
    return out
