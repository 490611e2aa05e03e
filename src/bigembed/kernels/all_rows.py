"""The embedding update of a batch that scored every entity (``all_negs`` / ``train_type: 1vsAll``).

Such a batch gives every row of the partition a gradient, so the sparse row-Adagrad update
(``unique`` over all row ids, then ``index_add_`` into the table, both over every row)
is replaced by a dense one: the positives' gradient rows are added into the whole-table
gradient, and one row-wise Adagrad step runs over the table in a few vectorised passes. Same rule as
:func:`bigembed.kernels.optimizers.row_adagrad_update` (the accumulator holds the running sum of
each row's mean squared gradient; PBG's Hogwild rule for the denominator).
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.kernels.optimizers import EPS
from bigembed.model import SideEmbeddings


def whole_table_gradient(side: SideEmbeddings) -> Tensor | None:
    """The side's gradient per partition row: the whole-table gradient plus its positives'."""
    if side.all is None:
        return None
    grad = side.all.grad
    if side.pos.grad is not None:
        if grad is None:
            grad = torch.zeros_like(side.all)
        grad.index_add_(0, side.pos_idx, side.pos.grad)
    return grad


def all_rows_adagrad_update(table: Tensor, state: Tensor, grad: Tensor, lr: float) -> None:
    """Row-wise Adagrad on every row of ``table`` with the dense gradient ``grad`` (N, D)."""
    sq = torch.linalg.vector_norm(grad, dim=1).square_().div_(grad.shape[1])
    local = state.clamp_min(0).add_(sq)
    state.add_(sq)
    table.addcdiv_(grad, local.sqrt_().add_(EPS).unsqueeze(1), value=-lr)
