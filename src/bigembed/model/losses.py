"""Loss functions over positive scores and their negatives (sum-reduced, PBG's definitions).

``pos``: ``(B,)`` scores. Negatives come as a list of score blocks ``(B, N_k)`` (batch negatives,
uniform negatives, ...) that together form the ``(B, N)`` matrix; keeping them apart avoids
copying the largest tensor of a step. Masked entries are already at -1e9. ``weight``: optional
``(B,)`` per-edge weights multiplying each positive's terms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from bigembed.model.names import LOSSES

Negatives = Sequence[Tensor]
LossFn = Callable[[Tensor, Negatives, "Tensor | None"], Tensor]
#: What :data:`bigembed.model.names.LOSSES` registers: the loss made from the margin.
LossFactory = Callable[[float], LossFn]


def _blocks(neg: Tensor | Negatives) -> list[Tensor]:
    return [neg] if isinstance(neg, Tensor) else [b for b in neg if b.shape[-1] > 0]


def _zero(pos: Tensor) -> Tensor:
    """A zero loss that still depends on ``pos``: backward gives zero gradients instead of
    failing (a batch may have no negatives: num_batch_negs = num_uniform_negs = 0, or every
    side disabled)."""
    return pos.sum() * 0.0


def _add_all(terms: Iterable[Tensor]) -> Tensor:
    """Σ ``terms`` (at least one), left to right: ``sum()`` starts from the int 0."""
    it = iter(terms)
    total = next(it)
    for t in it:
        total = total + t
    return total


def _weighted_sum(per_positive: Tensor, weight: Tensor | None) -> Tensor:
    if weight is not None:
        per_positive = per_positive * weight
    return per_positive.sum()


def ranking_loss(
    pos: Tensor, neg: Tensor | Negatives, weight: Tensor | None, margin: float
) -> Tensor:
    """Σ_j max(0, margin − s_i + t_ij)."""
    blocks = _blocks(neg)
    if pos.numel() == 0 or not blocks:
        return _zero(pos)
    threshold = (pos - margin).unsqueeze(-1)

    def hinge(b: Tensor) -> Tensor:
        d = b - threshold
        # In place when nothing is differentiated (evaluation): one block allocation less.
        return (d.clamp_min(0) if d.requires_grad else d.clamp_min_(0)).sum(-1)

    per_positive = _add_all(hinge(b) for b in blocks)
    return _weighted_sum(per_positive, weight)


def logistic_loss(pos: Tensor, neg: Tensor | Negatives, weight: Tensor | None) -> Tensor:
    """softplus(−s_i) + mean_j softplus(t_ij)."""
    if pos.numel() == 0:
        return _zero(pos)
    per_positive = F.softplus(-pos)
    blocks = _blocks(neg)
    total = sum(b.shape[-1] for b in blocks)
    if total:
        per_positive = per_positive + sum(F.softplus(b).sum(-1) for b in blocks) / total
    return _weighted_sum(per_positive, weight)


class _SoftmaxLoss(torch.autograd.Function):
    """Fused softmax cross-entropy over score blocks, the positive being class 0.

    Forward keeps the probabilities (block by block, no concatenation); backward is one
    multiply per block, so each block's gradient is a fresh contiguous tensor that the matmul
    backward can use without another copy. ``torch.logsumexp`` would recompute every exponential
    in its backward.
    """

    @staticmethod
    def forward(ctx, pos: Tensor, weight: Tensor | None, *blocks: Tensor) -> Tensor:
        m = pos.clone()
        for b in blocks:
            torch.maximum(m, b.amax(dim=-1), out=m)
        m = m.unsqueeze(-1)
        p_pos = (pos.unsqueeze(-1) - m).exp_()
        denom = p_pos.clone()
        probs = []
        for b in blocks:
            e = (b - m).exp_()
            denom += e.sum(-1, keepdim=True)
            probs.append(e)
        p_pos /= denom
        for e in probs:
            e /= denom
        per_positive = p_pos.squeeze(-1).clamp_min(1e-38).log_().neg_()
        ctx.save_for_backward(p_pos, weight, *probs)
        ctx.has_weight = weight is not None
        return per_positive.sum() if weight is None else (per_positive * weight).sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        p_pos, weight, *probs = ctx.saved_tensors
        g = grad_out.expand(p_pos.shape[0]) if not ctx.has_weight else grad_out * weight
        g = g.unsqueeze(-1)
        grad_pos = (p_pos - 1).mul_(g).squeeze(-1)
        return (grad_pos, None, *(e.mul_(g) for e in probs))


def softmax_loss(pos: Tensor, neg: Tensor | Negatives, weight: Tensor | None) -> Tensor:
    """−s_i + log(e^{s_i} + Σ_j e^{t_ij}): cross-entropy with the positive as the class."""
    if pos.numel() == 0:
        return _zero(pos)
    return _SoftmaxLoss.apply(pos, weight, *_blocks(neg))


class RankingLoss:
    """:func:`ranking_loss` with its margin bound.

    A module-level class, not a closure: the model (and so its loss) is pickled to spawn
    Hogwild workers, and local functions cannot be pickled.
    """

    def __init__(self, margin: float) -> None:
        self.margin = float(margin)

    def __call__(self, pos: Tensor, neg: Tensor | Negatives, weight: Tensor | None) -> Tensor:
        return ranking_loss(pos, neg, weight, self.margin)

    def __repr__(self) -> str:
        return f"RankingLoss(margin={self.margin})"


def logistic(margin: float) -> LossFn:
    """The ``logistic`` loss (no margin)."""
    return logistic_loss


def softmax(margin: float) -> LossFn:
    """The ``softmax`` loss (no margin)."""
    return softmax_loss


def make_loss(name: str, margin: float = 0.1) -> LossFn:
    """The loss called ``name`` (a name of :data:`bigembed.model.names.LOSSES`); every result
    is picklable (workers receive it by pickle)."""
    return LOSSES.get(name)(margin)
