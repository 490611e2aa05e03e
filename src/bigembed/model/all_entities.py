"""Softmax over every entity of a type (1-vs-all / ``all_negs``), one matrix product per tile.

Training with ``all_negs`` (or ``train_type: 1vsAll``) scores each query of a batch against every
entity of the corrupted side's partition: the cross-entropy of the true entity among all N
candidates. The candidates are the partition's rows after the same preparation as any negative
(global embedding, operator for standard-mode rhs, comparator normalisation), once per batch,
so the whole score matrix is ``anchors (B, D) @ candidates (N, D)^T``: nothing is copied per
edge. The query entity itself (the head of a tail query) is one of the N candidates and so a
negative like any other; only the true answer is the positive; other known true answers are
*not* filtered (as in the published 1-vs-all baselines).

Forward, ``TILE_ROWS`` anchors at a time: one product ``(R, D) x (D, N)`` in the compute dtype,
the row's positive picked from it, the violator count and a fused softmax while the tile is
hot, and the score gradient ``softmax - onehot`` (times the edge weight) stored once in the
compute dtype. Backward is two large products, ``G @ C`` for the anchors and ``G^T @ A`` for
the candidates (every row of the partition receives a gradient). When the gradient matrix
would exceed :data:`STORE_LIMIT_BYTES`, only the per-row log-sum-exp is kept and backward
recomputes each tile's scores (one product more, memory bounded by a tile).

Same math as ``softmax_loss`` over ``[positive | all entities with the positive masked]``;
tests check it against that naive path.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Anchors per tile: a (256, D) x (D, N) product runs near the matmul peak for D >= 64.
TILE_ROWS = 256
#: Largest score-gradient matrix (B x N in the compute dtype) kept between forward and backward.
STORE_LIMIT_BYTES = 512 * 2**20


class _Tiles:
    """Reused buffers for scoring ``TILE_ROWS`` anchors against the candidates ``ct`` (D, N)."""

    def __init__(self, ct: Tensor, rows: int) -> None:
        self.ct = ct
        num = ct.shape[1]
        self.scores = torch.empty((rows, num), dtype=ct.dtype)
        self.probs = torch.empty((rows, num), dtype=torch.float32)
        self.flags = torch.empty((rows, num), dtype=torch.bool)

    def gradient(
        self,
        a: Tensor,
        targets: Tensor,
        weight: Tensor | None,
        out: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """For anchors ``a`` (R, D): the score gradient ``softmax - onehot(target)`` (times the
        row weights) as fp32 ``(R, N)`` (written into ``out`` when given), the probability of
        each row's target and the number of candidates scoring above it."""
        n = a.shape[0]
        scores = torch.mm(a, self.ct, out=self.scores[:n])
        if scores.dtype != torch.float32:
            scores = scores.float()
        rows = torch.arange(n)
        pos = scores[rows, targets]
        # Reused bool buffer: count_nonzero(gt) without allocating a fresh (R, N) mask.
        violators = torch.count_nonzero(torch.gt(scores, pos.unsqueeze(1), out=self.flags[:n]))
        grad = torch.softmax(scores, 1, out=self.probs[:n] if out is None else out)
        p_pos = grad[rows, targets]
        grad[rows, targets] -= 1.0
        if weight is not None:
            grad.mul_(weight.unsqueeze(1))
        return grad, p_pos, violators


class _AllEntitySoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        anchors: Tensor,
        candidates: Tensor,
        targets: Tensor,
        weight: Tensor | None,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        batch = anchors.shape[0]
        num = candidates.shape[0]
        a = anchors.detach().to(dtype)
        c = candidates.detach().to(dtype)
        # (D, N) contiguous: the tile products run ~3x faster than against the transposed view.
        tiles = _Tiles(c.t().contiguous(), min(TILE_ROWS, batch))
        store = batch * num * a.element_size() <= STORE_LIMIT_BYTES
        grads = torch.empty((batch, num), dtype=dtype) if store else None
        p_pos = torch.empty(batch, dtype=torch.float32)
        violators = torch.zeros((), dtype=torch.int64)
        for r0 in range(0, batch, TILE_ROWS):
            r1 = min(r0 + TILE_ROWS, batch)
            w = None if weight is None else weight[r0:r1]
            # fp32: the softmax is written straight into the stored gradient matrix.
            direct = grads[r0:r1] if grads is not None and dtype == torch.float32 else None
            grad, p_pos[r0:r1], viol = tiles.gradient(a[r0:r1], targets[r0:r1], w, direct)
            violators += viol
            if grads is not None and direct is None:
                grads[r0:r1] = grad
        per_row = p_pos.clamp_min_(1e-38).log_().neg_()
        if weight is not None:
            per_row.mul_(weight)
        ctx.save_for_backward(a, c, targets, weight, grads)
        ctx.stored = grads is not None
        ctx.mark_non_differentiable(violators)
        return per_row.sum(), violators

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_violators: Tensor):
        a, c, targets, weight, grads = ctx.saved_tensors
        scale = float(grad_loss)
        if ctx.stored:
            grad_a = (grads @ c).float()
            grad_c = (grads.t() @ a).float()
        else:
            # Recompute each tile's gradient (one product more, memory bounded by a tile).
            batch = a.shape[0]
            tiles = _Tiles(c.t().contiguous(), min(TILE_ROWS, batch))
            grad_a = torch.empty(a.shape, dtype=torch.float32)
            grad_c = torch.zeros(c.shape, dtype=torch.float32)
            for r0 in range(0, batch, TILE_ROWS):
                r1 = min(r0 + TILE_ROWS, batch)
                w = None if weight is None else weight[r0:r1]
                g = tiles.gradient(a[r0:r1], targets[r0:r1], w)[0].to(a.dtype)
                grad_a[r0:r1] = g @ c
                grad_c += g.t() @ a[r0:r1]
        if scale != 1.0:
            grad_a.mul_(scale)
            grad_c.mul_(scale)
        return grad_a, grad_c, None, None, None


def all_entity_softmax_loss(
    anchors: Tensor,
    candidates: Tensor,
    targets: Tensor,
    weight: Tensor | None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, int]:
    """Σ_i w_i (logsumexp_j <a_i, c_j> - <a_i, c_{t_i}>): the softmax cross-entropy of each
    anchor's true candidate ``targets[i]`` among all rows of ``candidates`` (N, D).

    Gradients flow to ``anchors`` (B, D) and ``candidates``. Returns the summed (weighted) loss
    and the number of candidates scoring above their row's true candidate.
    """
    loss, violators = _AllEntitySoftmax.apply(anchors, candidates, targets.long(), weight, dtype)
    return loss, int(violators)
