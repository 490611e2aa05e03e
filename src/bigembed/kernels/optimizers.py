"""Hogwild-safe Adagrad: row-wise for embedding tables, element-wise for relation parameters.

Both follow PBG's rule for lock-free updates: a worker adds its squared gradient to the shared
accumulator *and* uses its own freshly summed value as the denominator, so a concurrent writer
can never make a worker's step larger than its gradient warrants.

The accumulator a worker reads is clamped at 0 before its own squared gradient is added. An
accumulator is a sum of squares and never negative in exact arithmetic, but a shared one is
also written by the distributed mode's communication thread, and a lossy exchange
(``communication.precision: int8``) can leave it a little below 0 for a moment; ``sqrt`` of
that would be NaN. With the clamp, a step is never larger than the one of a fresh accumulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

EPS = 1e-10


def row_adagrad_update(
    table: Tensor,
    state: Tensor,
    updates: Sequence[tuple[Tensor, Tensor]],
    lr: float,
) -> int:
    """Apply row-wise Adagrad to ``table`` for the rows named in ``updates``.

    ``updates`` is a list of ``(row indices (n,), gradients (n, D))``; duplicate rows are summed
    first (a row used as a positive and as a negative gets one combined step). ``state`` holds
    one accumulator per row: the running sum of the row's mean squared gradient. Returns the
    number of distinct rows touched.
    """
    if not updates:
        return 0
    idx = torch.cat([u[0] for u in updates]) if len(updates) > 1 else updates[0][0]
    uniq, inverse = torch.unique(idx.long(), return_inverse=True)
    dim = updates[0][1].shape[1]
    # Sum the gradients of duplicate rows block by block (no concatenated copy of them).
    summed = updates[0][1].new_zeros((uniq.numel(), dim))
    start = 0
    for rows, grad in updates:
        n = rows.shape[0]
        summed.index_add_(0, inverse[start : start + n], grad)
        start += n
    sq = summed.square().mean(1)
    local = state.index_select(0, uniq).clamp_min_(0).add_(sq)
    state.index_add_(0, uniq, sq)
    # One pass over the (rows, D) block: scale each row by -lr / (sqrt(local) + eps) in place.
    scale = local.sqrt_().add_(EPS).reciprocal_().mul_(-lr)
    table.index_add_(0, uniq, summed.mul_(scale.unsqueeze(1)))
    return int(uniq.numel())


def dense_adagrad_update(params: Iterable[Tensor], states: Sequence[Tensor], lr: float) -> None:
    """Element-wise Adagrad for parameters whose ``.grad`` is set (relation operators, globals)."""
    for param, state in zip(params, states, strict=True):
        grad = param.grad
        if grad is None:
            continue
        sq = grad * grad
        local = state.clamp_min(0).add_(sq)
        state.add_(sq)
        with torch.no_grad():
            param.addcdiv_(grad, local.sqrt_().add_(EPS), value=-lr)
        param.grad = None
