"""Gathering a batch's embedding rows: its positives and their uniform or all negatives.

Training gathers with gradients (and renormalises rows to ``max_norm`` in place); evaluation
gathers without. Batch negatives need no gathering: they are the other positives of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.model import NegativeSettings, SideEmbeddings


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


def draw_uniform(
    n: int, batch: int, negs: NegativeSettings, all_negs: bool, gen: torch.Generator
) -> Tensor | None:
    """The offsets of a side's uniform negatives (None with ``all_negs`` or without them)."""
    groups = negs.uniform_groups(batch)
    if all_negs or groups <= 0:
        return None
    return torch.randint(n, (groups * negs.num_uniform_negs,), generator=gen)


def gather_drawn(
    emb: Tensor,
    idx: Tensor,
    negs: NegativeSettings,
    all_negs: bool,
    uidx: Tensor | None,
    max_norm: float | None,
    grad: bool = True,
) -> SideEmbeddings:
    """Gather a side's positives (rows ``idx`` of the partition's embeddings ``emb``) and its
    negatives: the uniform ones at offsets ``uidx`` (:func:`draw_uniform`), or with
    ``all_negs`` the whole partition."""
    pos = gather_rows(emb, idx, max_norm, grad)
    uniform = whole = None
    if all_negs:
        whole = gather_rows(emb, torch.arange(emb.shape[0]), max_norm, grad)
    elif uidx is not None:
        uniform = gather_rows(emb, uidx, max_norm, False).view(
            -1, negs.num_uniform_negs, pos.shape[1]
        )
        uniform.requires_grad_(grad)
    return SideEmbeddings(pos, idx, uniform, whole)


def gather_side(
    emb: Tensor,
    idx: Tensor,
    negs: NegativeSettings,
    all_negs: bool,
    gen: torch.Generator,
    max_norm: float | None,
    grad: bool = True,
) -> tuple[SideEmbeddings, Tensor | None]:
    """Draw a side's uniform negatives and gather it (:func:`gather_drawn`); returns the
    gathered rows and the uniform draw's indices."""
    uidx = draw_uniform(emb.shape[0], idx.shape[0], negs, all_negs, gen)
    return gather_drawn(emb, idx, negs, all_negs, uidx, max_norm, grad), uidx
