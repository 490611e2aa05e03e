"""Comparators: the similarity between a (transformed) embedding and its counterpart.

Every comparator works on chunks: ``pos(a, b)`` scores matching rows, ``neg(anchors, negs)``
scores each anchor of a group against every negative of the same group with ONE batched
matrix product (``(G, M, D) x (G, N, D) -> (G, M, N)``). That product is where training spends
its time, so nothing here copies the negatives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.model.names import COMPARATORS


class Comparator:
    def prepare(self, x: Tensor) -> Tensor:
        """Transform embeddings once before any comparison (``cos`` normalises here)."""
        return x

    def pos(self, a: Tensor, b: Tensor) -> Tensor:
        raise NotImplementedError

    def neg(self, anchors: Tensor, negs: Tensor) -> Tensor:
        raise NotImplementedError


class DotComparator(Comparator):
    def pos(self, a: Tensor, b: Tensor) -> Tensor:
        return (a * b).sum(-1)

    def neg(self, anchors: Tensor, negs: Tensor) -> Tensor:
        return torch.bmm(anchors, negs.transpose(1, 2))


class _Normalize(torch.autograd.Function):
    """``F.normalize(x, dim=-1, eps=1e-12)`` with a two-pass backward.

    Autograd's backward of ``x / norm(x).clamp_min(eps)`` walks the rows once per operation
    (div, its two gradients, the norm's gradient, the expand's sum, ...). Here:
    ``(g - y (g . y)) / |x|`` (the rows whose norm is clamped to ``eps`` are divided by a
    constant: ``g / eps``).
    """

    EPS = 1e-12

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        inv = norm.clamp_min_(_Normalize.EPS).reciprocal_()
        y = x * inv
        ctx.save_for_backward(y, inv)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        y, inv = ctx.saved_tensors
        proj = (g * y).sum(-1, keepdim=True)
        proj.masked_fill_(inv >= 1 / _Normalize.EPS, 0.0)  # clamped rows: x / eps is linear
        return (g - y * proj).mul_(inv)


class CosComparator(DotComparator):
    def prepare(self, x: Tensor) -> Tensor:
        return _Normalize.apply(x)


class SquaredL2Comparator(Comparator):
    """Negative squared Euclidean distance, expanded so negatives cost one matmul."""

    def pos(self, a: Tensor, b: Tensor) -> Tensor:
        return -(a - b).pow(2).sum(-1)

    def neg(self, anchors: Tensor, negs: Tensor) -> Tensor:
        a2 = anchors.pow(2).sum(-1, keepdim=True)  # (G, M, 1)
        b2 = negs.pow(2).sum(-1).unsqueeze(1)  # (G, 1, N)
        return torch.baddbmm(a2 + b2, anchors, negs.transpose(1, 2), alpha=-2.0).neg()


class L2Comparator(SquaredL2Comparator):
    def pos(self, a: Tensor, b: Tensor) -> Tensor:
        return -(a - b).pow(2).sum(-1).clamp_min(1e-30).sqrt()

    def neg(self, anchors: Tensor, negs: Tensor) -> Tensor:
        return super().neg(anchors, negs).neg().clamp_min(1e-30).sqrt().neg()


class BiasedComparator(Comparator):
    """The base comparator on coordinates 1..D-1 plus the two coordinate-0 biases."""

    def __init__(self, base: Comparator) -> None:
        self.base = base

    def prepare(self, x: Tensor) -> Tensor:
        return torch.cat((x[..., :1], self.base.prepare(x[..., 1:])), dim=-1)

    def pos(self, a: Tensor, b: Tensor) -> Tensor:
        return self.base.pos(a[..., 1:], b[..., 1:]) + a[..., 0] + b[..., 0]

    def neg(self, anchors: Tensor, negs: Tensor) -> Tensor:
        scores = self.base.neg(anchors[..., 1:], negs[..., 1:])
        return scores + anchors[..., :1] + negs[..., 0].unsqueeze(1)


def make_comparator(name: str, bias: bool = False) -> Comparator:
    """The comparator called ``name`` (a name of :data:`bigembed.model.names.COMPARATORS`);
    with ``bias``, coordinate 0 of each embedding is an additive bias."""
    comparator = COMPARATORS.get(name)()
    return BiasedComparator(comparator) if bias else comparator
