"""Fused sampled-negative losses (softmax, ranking, logistic), computed tile by tile in cache.

The unfused path materialises the ``(B, N)`` score matrix of a batch against its uniform
negatives and then walks it about ten times (dtype conversion, max, subtract, exp, sum, divide,
gradient scaling, conversion back, violator count). At B = N = 1000 that matrix is larger than a
core's L2 cache, so every walk goes to memory, and the walks can cost more than the matrix
products themselves in bf16.

Here the scores of ``TILE_ROWS`` anchors at a time (more when rows are narrow) are produced,
turned into the loss's gradient (softmax probabilities, ranking indicators) while they are
still in cache, and only the gradient of the
scores leaves the loop, stored once in the compute dtype: exactly the operand the two backward
matrix products read. Violators (negatives scoring above their positive) are counted in the
same pass. The math is the unfused loss of :mod:`bigembed.model.losses` applied to
``[pos | batch negatives | anchors x shared negatives | query entity]``; tests check the two
agree. The last column (option ``self_negative``) is each anchor's score against one row of its
own, the edge's query entity as a candidate of the corrupted side: one row-wise dot product
per side, masked where that entity is the true answer.

Ranking and logistic losses take the same path: their per-score gradient is as cheap as their
loss (an indicator, a sigmoid), and at small dimensions the unfused path's score blocks, masks,
autograd nodes and violator counts cost more than the products themselves.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from bigembed.model.negatives import MASKED, batch_negative_mask, pad_rows

# Rows of a tile: 256 keeps the bf16 product near the matmul peak; whole steps do not depend on
# it between 128 and 512 rows.
TILE_ROWS = 256
# A tile holds at most this many scores (256 x 1051, 1 MB of fp32: the width of 1000 uniform +
# 50 batch negatives): narrower rows (few negatives) take more rows per tile, so a batch with
# 100 negatives is one tile instead of four loop turns of Python overhead.
TILE_SCORES = 256 * 1051

LOSS_KINDS = ("softmax", "ranking", "logistic")


@functools.lru_cache(maxsize=8)
def _batch_mask(batch: int, chunk: int) -> Tensor:
    """:func:`batch_negative_mask`, built once per shape (every training batch has the same)."""
    return batch_negative_mask(batch, chunk)


def tile_rows(width: int) -> int:
    """Rows per tile for score rows of ``width`` columns."""
    return max(TILE_ROWS, TILE_SCORES // max(1, width))


def _tile_loss(x: Tensor, kind: str, margin: float, num_negs: int) -> tuple[Tensor, Tensor, Tensor]:
    """Loss terms of a tile ``x = [pos | negatives]`` (rows, 1 + n): (per-row loss,
    d loss / d pos (rows,), d loss / d negatives (rows, n), a fresh tensor). ``num_negs`` is
    the logistic mean's denominator (masked negatives count in it, as in the unfused loss)."""
    if kind == "softmax":
        p = torch.softmax(x, dim=1)
        p0 = p[:, 0]
        return p0.clamp_min(1e-38).log().neg_(), p0 - 1.0, p[:, 1:]
    if kind == "ranking":
        d = x[:, 1:] - (x[:, :1] - margin)
        g = (d > 0).to(x.dtype)
        return d.clamp_min_(0).sum(1), g.sum(1).neg_(), g
    # logistic: softplus(-pos) + mean softplus(neg)
    neg = x[:, 1:]
    loss = torch.nn.functional.softplus(-x[:, 0]) + torch.nn.functional.softplus(neg).sum(1).div_(
        num_negs
    )
    return loss, torch.sigmoid(x[:, 0]).sub_(1.0), torch.sigmoid(neg).div_(num_negs)


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        pos: Tensor,
        anchors: Tensor,
        negs: Tensor,
        src: Tensor | None,
        weight: Tensor | None,
        group_size: int,
        chunk: int,
        dtype: torch.dtype,
        kind: str,
        margin: float,
        self_rows: Tensor | None,
        self_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        batch, dim = anchors.shape
        groups, num_negs, _ = negs.shape
        a = anchors.to(dtype)
        u = negs.to(dtype)
        # Batch negatives: the src rows of the anchor's own chunk, one small product per chunk.
        k = 0
        a_chunks = s_chunks = batch_scores = None
        if src is not None:
            k = min(chunk, batch)
            padded = -(-batch // k) * k
            a_chunks = pad_rows(a, padded).view(-1, k, dim)
            s_chunks = pad_rows(src.to(dtype), padded).view(-1, k, dim)
            batch_scores = torch.bmm(a_chunks, s_chunks.transpose(1, 2)).view(padded, k)[:batch]
            batch_scores = batch_scores.float().masked_fill_(_batch_mask(batch, k), MASKED)
        # The query-entity column: one score per anchor, against its own row.
        s_rows = self_scores = None
        if self_rows is not None:
            assert self_mask is not None
            s_rows = self_rows.to(dtype)
            self_scores = (a * s_rows).sum(1).float().masked_fill_(self_mask, MASKED)
        extra = int(self_scores is not None)
        width = 1 + k + num_negs + extra
        rows = tile_rows(width)
        grad_negs_scores = torch.empty((batch, num_negs), dtype=dtype)
        grad_batch_scores = torch.empty((batch, k), dtype=torch.float32)
        grad_pos = torch.empty(batch, dtype=torch.float32)
        grad_self = torch.empty(batch, dtype=torch.float32) if extra else None
        per_positive = torch.empty(batch, dtype=torch.float32)
        violators = torch.zeros((), dtype=torch.float64)
        tile = torch.empty((min(rows, batch), width), dtype=torch.float32)
        for g in range(groups):
            g_end = min((g + 1) * group_size, batch)
            for r0 in range(g * group_size, g_end, rows):
                r1 = min(r0 + rows, g_end)
                x = tile[: r1 - r0]
                x[:, 0] = pos[r0:r1]
                if batch_scores is not None:
                    x[:, 1 : 1 + k] = batch_scores[r0:r1]
                x[:, 1 + k : 1 + k + num_negs] = a[r0:r1] @ u[g].t()
                if self_scores is not None:
                    x[:, -1] = self_scores[r0:r1]
                # #(negatives > positive): sign(max(0, x - pos)) summed; the positive's own
                # column adds 0. Faster than count_nonzero(x > pos), whose bool output is slow.
                violators += torch.sub(x, x[:, :1]).clamp_(min=0).sign_().sum()
                loss_rows, g_pos, g_negs = _tile_loss(x, kind, margin, k + num_negs + extra)
                if weight is not None:
                    w = weight[r0:r1]
                    loss_rows = loss_rows * w
                    g_pos = g_pos * w
                    g_negs = g_negs * w.unsqueeze(1)
                per_positive[r0:r1] = loss_rows
                grad_pos[r0:r1] = g_pos
                grad_batch_scores[r0:r1] = g_negs[:, :k]
                grad_negs_scores[r0:r1] = g_negs[:, k : k + num_negs]
                if grad_self is not None:
                    grad_self[r0:r1] = g_negs[:, -1]
        loss = per_positive.sum()
        ctx.save_for_backward(
            a,
            u,
            grad_negs_scores,
            grad_pos,
            grad_batch_scores,
            a_chunks,
            s_chunks,
            s_rows,
            grad_self,
        )
        ctx.group_size = group_size
        ctx.has_src = src is not None
        ctx.mark_non_differentiable(violators)
        return loss, violators

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_violators: Tensor):
        a, u, gs, grad_pos, gb, a_chunks, s_chunks, s_rows, grad_self = ctx.saved_tensors
        batch, dim = a.shape
        groups = u.shape[0]
        gsize = ctx.group_size
        scale = float(grad_loss)
        grad_anchors = torch.empty((batch, dim), dtype=torch.float32)
        grad_negs = torch.empty(u.shape, dtype=torch.float32)
        for g in range(groups):
            r0, r1 = g * gsize, min((g + 1) * gsize, batch)
            grad_anchors[r0:r1] = gs[r0:r1] @ u[g]
            grad_negs[g] = gs[r0:r1].t() @ a[r0:r1]
        grad_src = None
        if ctx.has_src:
            chunks, k, _ = a_chunks.shape
            gb = pad_rows(gb, chunks * k).to(a.dtype).view(chunks, k, k)
            grad_anchors += torch.bmm(gb, s_chunks).view(-1, dim)[:batch]
            grad_src = torch.bmm(gb.transpose(1, 2), a_chunks).view(-1, dim)[:batch].float()
        grad_self_rows = None
        if grad_self is not None:
            g = grad_self.unsqueeze(1)
            grad_anchors.addcmul_(g, s_rows.float())
            grad_self_rows = g * a.float()
        if scale != 1.0:
            grad_anchors.mul_(scale)
            grad_negs.mul_(scale)
            if grad_src is not None:
                grad_src.mul_(scale)
            if grad_self_rows is not None:
                grad_self_rows.mul_(scale)
        grads = (grad_pos * scale, grad_anchors, grad_negs, grad_src)
        return (*grads, None, None, None, None, None, None, grad_self_rows, None)


def fused_sampled_loss(
    pos: Tensor,
    anchors: Tensor,
    negs: Tensor,
    group_size: int,
    weight: Tensor | None,
    dtype: torch.dtype,
    src: Tensor | None = None,
    chunk_size: int = 0,
    kind: str = "softmax",
    margin: float = 0.1,
    self_rows: Tensor | None = None,
    self_mask: Tensor | None = None,
) -> tuple[Tensor, int]:
    """The ``kind`` loss (one of :data:`LOSS_KINDS`; ``margin``: the ranking loss's) of ``pos``
    (B,) against the dot products of ``anchors`` (B, D) with

    * the shared negatives ``negs`` (G, N, D), anchor row r using group ``r // group_size``;
    * with ``src`` (B, D): the batch negatives, the ``src`` rows of the anchor's own chunk of
      ``chunk_size`` rows (its own positive and padding masked, as
      :func:`bigembed.model.negatives.batch_negative_scores`);
    * with ``self_rows`` (B, D): one more negative per anchor, its own row (the query entity,
      ``self_negative``), masked where ``self_mask`` (B,) is true, as
      :func:`bigembed.model.negatives.self_negative_scores`.

    Returns the summed (weighted) loss and the number of negatives scoring above their positive.
    """
    if kind not in LOSS_KINDS:
        raise ValueError(f"no fused {kind!r} loss (fused: {', '.join(LOSS_KINDS)})")
    loss, violators = _FusedLoss.apply(
        pos,
        anchors,
        negs,
        src,
        weight,
        group_size,
        chunk_size,
        dtype,
        kind,
        float(margin),
        self_rows,
        self_mask,
    )
    return loss, int(violators)
