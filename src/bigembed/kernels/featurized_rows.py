"""Rows of a featurized type in a training step: gathered as bag means, updated as features.

A featurized type's table (:class:`~bigembed.kernels.step.Table` with ``bags``) holds one row
per *feature*; the step still sees one leaf row per *entity* (the weighted mean of its
features, :class:`bigembed.model.FeatureBags`), so the scoring model, every negative mode,
operator and loss are unchanged. After the backward pass the entity-row gradients are routed to
the feature rows (the exact backward of the mean) and applied with the same row Adagrad, whose
state is per feature row. ``max_norm`` renormalises the entity rows as used, never the features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from bigembed.buckets import draw_uniform, gather_drawn, gather_rows
from bigembed.kernels.all_rows import all_rows_adagrad_update
from bigembed.kernels.optimizers import row_adagrad_update
from bigembed.model import NegativeSettings, SideEmbeddings

if TYPE_CHECKING:
    from bigembed.kernels.step import Table


def num_entities(table: Table) -> int:
    """Entities of the table's partition (feature rows are not entities)."""
    return table.emb.shape[0] if table.bags is None else len(table.bags)


def entity_rows(
    table: Table, idx: Tensor | None, max_norm: float | None, grad: bool = True
) -> Tensor:
    """Entity rows ``idx`` (all when None) as a leaf tensor."""
    if table.bags is None:
        rows_idx = torch.arange(table.emb.shape[0]) if idx is None else idx
        return gather_rows(table.emb, rows_idx, max_norm, grad)
    rows = table.bags.mean(table.emb, idx)
    if max_norm is not None:
        norms = rows.norm(dim=1, keepdim=True)
        rows.mul_((max_norm / norms.clamp_min(1e-7)).clamp_max(1.0))
    return rows.requires_grad_(grad)


def entity_table(table: Table) -> Tensor:
    """The whole partition as entity rows (for ranking; a view of the table when plain)."""
    return table.emb if table.bags is None else table.bags.mean(table.emb)


def gather_table_side(
    table: Table,
    idx: Tensor,
    negs: NegativeSettings,
    all_negs: bool,
    gen: torch.Generator,
    max_norm: float | None,
) -> tuple[SideEmbeddings, Tensor | None]:
    """:func:`bigembed.buckets.gather_side` for any table, featurized or not."""
    uidx = draw_uniform(num_entities(table), idx.shape[0], negs, all_negs, gen)
    if table.bags is None:
        return gather_drawn(table.emb, idx, negs, all_negs, uidx, max_norm), uidx
    pos = entity_rows(table, idx, max_norm)
    uniform = whole = None
    if all_negs:
        whole = entity_rows(table, None, max_norm)
    elif uidx is not None:
        uniform = entity_rows(table, uidx, max_norm, False).view(
            -1, negs.num_uniform_negs, pos.shape[1]
        )
        uniform.requires_grad_(True)
    return SideEmbeddings(pos, idx, uniform, whole), uidx


def routed(table: Table, updates: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """Entity-row gradients as the table's row gradients (feature rows when featurized)."""
    if table.bags is None:
        return updates
    return [table.bags.feature_grads(i, g) for i, g in updates]


def update_all_rows(table: Table, grad: Tensor, lr: float, frozen: int = 0) -> None:
    """The update of a gradient on every entity row (``all_negs`` / 1-vs-all), leaving the
    first ``frozen`` rows unchanged (a featurized table has no frozen rows: the config refuses
    ``growth.freeze`` with featurized types, whose features the old and new entities share)."""
    if table.bags is None:
        f = frozen
        all_rows_adagrad_update(table.emb[f:], table.state[f:], grad[f:], lr)
    else:
        if frozen:
            raise ValueError("a featurized table has no frozen rows")
        row_adagrad_update(table.emb, table.state, [table.bags.feature_grads(None, grad)], lr)
