"""Gathering a batch's embedding rows: its positives and their uniform or all negatives.

Training gathers with gradients (and renormalises rows to ``max_norm`` in place); evaluation
gathers without. Batch negatives need no gathering: they are the other positives of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.model.scoring import NegativeSettings, SideEmbeddings


def gather_rows(table: Tensor, idx: Tensor, max_norm: float | None, grad: bool = True) -> Tensor:
    """Copy rows out of ``table`` as a leaf tensor.

    With ``max_norm`` the rows are renormalised in place first (the semantics of an embedding
    lookup with ``max_norm``).
    """
    rows = table.index_select(0, idx)
    if max_norm is not None:
        norms = rows.norm(dim=1, keepdim=True)
        rows.mul_((max_norm / norms.clamp_min(1e-7)).clamp_max(1.0))
        table.index_copy_(0, idx, rows)
    return rows.requires_grad_(grad)


def gather_side(
    emb: Tensor,
    idx: Tensor,
    negs: NegativeSettings,
    all_negs: bool,
    gen: torch.Generator,
    max_norm: float | None,
    grad: bool = True,
) -> tuple[SideEmbeddings, Tensor | None]:
    """Gather a side's positives (rows ``idx`` of the partition's embeddings ``emb``) and its
    negatives; returns them and the uniform draw's indices."""
    pos = gather_rows(emb, idx, max_norm, grad)
    n = emb.shape[0]
    groups = negs.uniform_groups(idx.shape[0])
    uniform = uidx = whole = None
    if all_negs:
        whole = gather_rows(emb, torch.arange(n), max_norm, grad)
    elif groups > 0:
        uidx = torch.randint(n, (groups * negs.num_uniform_negs,), generator=gen)
        uniform = gather_rows(emb, uidx, max_norm, False).view(groups, negs.num_uniform_negs, -1)
        uniform.requires_grad_(grad)
    return SideEmbeddings(pos, idx, uniform, whole), uidx
