"""Loss functions over positive scores and their negatives (sum-reduced, PBG's definitions).

``pos``: ``(B,)`` scores; ``neg``: ``(B, N)`` scores (masked entries already at -1e9);
``weight``: optional ``(B,)`` per-edge weights multiplying each positive's terms.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

LossFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


def _weighted_sum(per_positive: Tensor, weight: Tensor | None) -> Tensor:
    if weight is not None:
        per_positive = per_positive * weight
    return per_positive.sum()


def ranking_loss(pos: Tensor, neg: Tensor, weight: Tensor | None, margin: float) -> Tensor:
    """Σ_j max(0, margin − s_i + t_ij)."""
    if pos.numel() == 0 or neg.numel() == 0:
        return pos.new_zeros(())
    per_positive = (neg - pos.unsqueeze(-1) + margin).clamp_min(0).sum(-1)
    return _weighted_sum(per_positive, weight)


def logistic_loss(pos: Tensor, neg: Tensor, weight: Tensor | None) -> Tensor:
    """softplus(−s_i) + mean_j softplus(t_ij)."""
    if pos.numel() == 0:
        return pos.new_zeros(())
    per_positive = F.softplus(-pos)
    if neg.numel() > 0 and neg.shape[-1] > 0:
        per_positive = per_positive + F.softplus(neg).mean(-1)
    return _weighted_sum(per_positive, weight)


def softmax_loss(pos: Tensor, neg: Tensor, weight: Tensor | None) -> Tensor:
    """−s_i + log(e^{s_i} + Σ_j e^{t_ij}): cross-entropy with the positive as the class."""
    if pos.numel() == 0:
        return pos.new_zeros(())
    lse = torch.logsumexp(torch.cat((pos.unsqueeze(-1), neg), dim=-1), dim=-1)
    return _weighted_sum(lse - pos, weight)


def make_loss(name: str, margin: float = 0.1) -> LossFn:
    if name == "ranking":
        return lambda pos, neg, weight: ranking_loss(pos, neg, weight, margin)
    if name == "logistic":
        return logistic_loss
    if name == "softmax":
        return softmax_loss
    raise ValueError(f"unknown loss {name!r} (known: ranking, logistic, softmax)")
