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

Grouped queries (``train_type: KvsAll``): one anchor per distinct query ``(h, r, ?)`` with
every true answer of the batch as a (row, target) pair. The row's gradient is then
``k softmax - multi-hot`` (edge weights: ``Σw softmax - Σ w onehot``), exactly the summed
1-vs-all gradients of the query's k edges, from one score row instead of k.

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
        self, a: Tensor, pairs: _TilePairs, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """For anchors ``a`` (R, D): the score gradient ``W_r softmax - Σ w_p onehot(target_p)``
        as fp32 ``(R, N)`` (written into ``out`` when given), the probability of each pair's
        target and the number of candidates scoring above it, summed over the pairs."""
        n = a.shape[0]
        scores = torch.mm(a, self.ct, out=self.scores[:n])
        if scores.dtype != torch.float32:
            scores = scores.float()
        pos = scores[pairs.rows, pairs.cols]
        # Reused bool buffer: count_nonzero(gt) without allocating a fresh (R, N) mask.
        if pairs.identity:
            above = torch.gt(scores, pos.unsqueeze(1), out=self.flags[:n])
        else:  # several pairs per row (grouped queries): one score row per pair
            above = torch.gt(scores.index_select(0, pairs.rows), pos.unsqueeze(1))
        violators = torch.count_nonzero(above)
        grad = torch.softmax(scores, 1, out=self.probs[:n] if out is None else out)
        p_pos = grad[pairs.rows, pairs.cols]
        if pairs.row_weight is not None:
            grad.mul_(pairs.row_weight.unsqueeze(1))
        grad.index_put_((pairs.rows, pairs.cols), pairs.minus_weight, accumulate=True)
        return grad, p_pos, violators


class _TilePairs:
    """The (anchor row, target candidate, weight) pairs of one tile, rows local to the tile.

    ``row_weight`` (R,) is the summed weight of each row's pairs (None: every row has exactly
    one pair of weight 1); ``minus_weight`` the negated pair weights, added at the targets."""

    def __init__(
        self, rows: Tensor, cols: Tensor, weight: Tensor | None, num_rows: int, identity: bool
    ) -> None:
        self.rows = rows
        self.cols = cols
        self.identity = identity
        ones = weight is None
        w = torch.ones(rows.shape[0]) if weight is None else weight
        self.minus_weight = -w
        if identity and ones:
            self.row_weight: Tensor | None = None
        elif identity:
            self.row_weight = w
        else:
            self.row_weight = torch.zeros(num_rows).index_add_(0, rows, w)


class _Pairs:
    """All pairs of a batch, sorted by anchor row, cut into :class:`_TilePairs` per tile."""

    def __init__(self, rows: Tensor | None, cols: Tensor, weight: Tensor | None, num_rows: int):
        self.identity = rows is None
        if rows is None:
            rows = torch.arange(num_rows)
        else:
            order = torch.argsort(rows, stable=True)
            rows, cols = rows[order], cols[order]
            weight = None if weight is None else weight[order]
        self.rows, self.cols, self.weight = rows, cols, weight
        self.bounds = torch.searchsorted(rows, torch.arange(0, num_rows + TILE_ROWS, TILE_ROWS))

    def tile(self, r0: int, r1: int) -> _TilePairs:
        b0, b1 = int(self.bounds[r0 // TILE_ROWS]), int(self.bounds[-(-r1 // TILE_ROWS)])
        w = None if self.weight is None else self.weight[b0:b1]
        return _TilePairs(self.rows[b0:b1] - r0, self.cols[b0:b1], w, r1 - r0, self.identity)


class _AllEntitySoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        anchors: Tensor,
        candidates: Tensor,
        pairs: _Pairs,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        batch = anchors.shape[0]
        num = candidates.shape[0]
        a = anchors.detach().to(dtype)
        c = candidates.detach().to(dtype)
        # (D, N) contiguous: the tile products run much faster than against the transposed view.
        tiles = _Tiles(c.t().contiguous(), min(TILE_ROWS, batch))
        store = batch * num * a.element_size() <= STORE_LIMIT_BYTES
        grads = torch.empty((batch, num), dtype=dtype) if store else None
        p_pos = torch.empty(pairs.rows.shape[0], dtype=torch.float32)
        violators = torch.zeros((), dtype=torch.int64)
        for r0 in range(0, batch, TILE_ROWS):
            r1 = min(r0 + TILE_ROWS, batch)
            tp = pairs.tile(r0, r1)
            b0 = int(pairs.bounds[r0 // TILE_ROWS])
            # fp32: the softmax is written straight into the stored gradient matrix.
            direct = grads[r0:r1] if grads is not None and dtype == torch.float32 else None
            grad, p, viol = tiles.gradient(a[r0:r1], tp, direct)
            p_pos[b0 : b0 + p.shape[0]] = p
            violators += viol
            if grads is not None and direct is None:
                grads[r0:r1] = grad
        per_pair = p_pos.clamp_min_(1e-38).log_().neg_()
        if pairs.weight is not None:
            per_pair.mul_(pairs.weight)
        ctx.save_for_backward(a, c, grads)
        ctx.pairs = pairs
        ctx.stored = grads is not None
        ctx.mark_non_differentiable(violators)
        return per_pair.sum(), violators

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_violators: Tensor):
        a, c, grads = ctx.saved_tensors
        pairs: _Pairs = ctx.pairs
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
                g = tiles.gradient(a[r0:r1], pairs.tile(r0, r1))[0].to(a.dtype)
                grad_a[r0:r1] = g @ c
                grad_c += g.t() @ a[r0:r1]
        if scale != 1.0:
            grad_a.mul_(scale)
            grad_c.mul_(scale)
        return grad_a, grad_c, None, None


def all_entity_softmax_loss(
    anchors: Tensor,
    candidates: Tensor,
    targets: Tensor,
    weight: Tensor | None,
    dtype: torch.dtype = torch.float32,
    rows: Tensor | None = None,
) -> tuple[Tensor, int]:
    """Σ_p w_p (logsumexp_j <a_{r_p}, c_j> - <a_{r_p}, c_{t_p}>): the softmax cross-entropy of
    each pair's true candidate ``targets[p]`` among all rows of ``candidates`` (N, D), scored
    against anchor ``rows[p]`` (``rows`` None: pair p is anchor p, one pair per anchor).

    Several pairs on one anchor (a query with several true answers, ``train_type: KvsAll``)
    give exactly the loss and gradients of as many copies of the anchor with one pair each,
    from one score row. Gradients flow to ``anchors`` (Q, D) and ``candidates``. Returns the
    summed (weighted) loss and the number of candidates scoring above each pair's target,
    summed over the pairs.
    """
    pairs = _Pairs(None if rows is None else rows.long(), targets.long(), weight, anchors.shape[0])
    loss, violators = _AllEntitySoftmax.apply(anchors, candidates, pairs, dtype)
    return loss, int(violators)
