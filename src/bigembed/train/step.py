"""One training step: gather rows, score, backpropagate, apply the fused sparse updates."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from bigembed.model.scoring import NegativeSettings, ScoringModel, SideEmbeddings
from bigembed.train.batching import Batch
from bigembed.train.optimizers import dense_adagrad_update, row_adagrad_update


@dataclass
class Table:
    """One loaded partition of one entity type: embeddings and their row-Adagrad state."""

    emb: Tensor  # (N, D) float32, shared memory when Hogwild workers use it
    state: Tensor  # (N,) float32


@dataclass
class StepStats:
    loss: float = 0.0
    reg: float = 0.0
    violators_lhs: int = 0
    violators_rhs: int = 0
    count: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, other: StepStats) -> None:
        self.loss += other.loss
        self.reg += other.reg
        self.violators_lhs += other.violators_lhs
        self.violators_rhs += other.violators_rhs
        self.count += other.count

    def as_dict(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "reg": self.reg,
            "violators_lhs": self.violators_lhs,
            "violators_rhs": self.violators_rhs,
            "count": self.count,
        }


def _gather(table: Tensor, idx: Tensor, max_norm: float | None, grad: bool = True) -> Tensor:
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
    table: Table,
    idx: Tensor,
    negs: NegativeSettings,
    all_negs: bool,
    gen: torch.Generator,
    max_norm: float | None,
    grad: bool = True,
) -> tuple[SideEmbeddings, Tensor | None]:
    """Gather a side's positives and its negatives; returns them and the uniform draw's indices."""
    pos = _gather(table.emb, idx, max_norm, grad)
    n = table.emb.shape[0]
    groups = negs.uniform_groups(idx.shape[0])
    uniform = uidx = whole = None
    if all_negs:
        whole = _gather(table.emb, torch.arange(n), max_norm, grad)
    elif groups > 0:
        uidx = torch.randint(n, (groups * negs.num_uniform_negs,), generator=gen)
        uniform = _gather(table.emb, uidx, max_norm, False).view(groups, negs.num_uniform_negs, -1)
        uniform.requires_grad_(grad)
    return SideEmbeddings(pos, idx, uniform, whole), uidx


class BatchTrainer:
    """Runs training steps for one worker against the tables of the current bucket."""

    def __init__(
        self,
        model: ScoringModel,
        model_states: list[Tensor],
        negs: NegativeSettings,
        lr: float,
        relation_lr: float,
        generator: torch.Generator,
    ) -> None:
        self.model = model
        self.params = [p for p in model.parameters()]
        self.model_states = model_states
        self.negs = negs
        self.lr = lr
        self.relation_lr = relation_lr
        self.gen = generator
        self.max_norm = model.config.max_norm

    def step(self, batch: Batch, lhs: Table, rhs: Table) -> StepStats:
        model = self.model
        rcfg = model.relation_config(batch.relation_idx)
        all_negs = bool(rcfg.all_negs)
        lhs_side, lhs_uidx = gather_side(
            lhs, batch.lhs, self.negs, all_negs, self.gen, self.max_norm
        )
        rhs_side, rhs_uidx = gather_side(
            rhs, batch.rhs, self.negs, all_negs, self.gen, self.max_norm
        )
        scores = model(
            lhs_side,
            rhs_side,
            batch.rel,
            batch.relation_idx,
            batch.weight,
            self.negs,
            need_scores=False,
        )
        total = scores.loss + scores.reg
        total.backward()

        def updates(side: SideEmbeddings, uidx: Tensor | None) -> list[tuple[Tensor, Tensor]]:
            out = [(side.pos_idx, side.pos.grad)]
            if side.uniform is not None and uidx is not None and side.uniform.grad is not None:
                out.append((uidx, side.uniform.grad.view(uidx.shape[0], -1)))
            if side.all is not None and side.all.grad is not None:
                out.append((torch.arange(side.all.shape[0]), side.all.grad))
            return [(i, g) for i, g in out if g is not None]

        with torch.no_grad():
            lhs_updates = updates(lhs_side, lhs_uidx)
            rhs_updates = updates(rhs_side, rhs_uidx)
            if lhs.emb is rhs.emb:
                row_adagrad_update(lhs.emb, lhs.state, lhs_updates + rhs_updates, self.lr)
            else:
                row_adagrad_update(lhs.emb, lhs.state, lhs_updates, self.lr)
                row_adagrad_update(rhs.emb, rhs.state, rhs_updates, self.lr)
        dense_adagrad_update(self.params, self.model_states, self.relation_lr)

        violators_lhs, violators_rhs = scores.violators()
        stats = StepStats(
            loss=float(scores.loss.detach()),
            reg=float(scores.reg.detach()),
            violators_lhs=violators_lhs,
            violators_rhs=violators_rhs,
            count=len(batch),
        )
        return stats
