"""One training step: gather rows, score, backpropagate, apply the fused sparse updates.

Frozen parts (``growth.freeze``, see :mod:`bigembed.train.growth`) are enforced here, in the
update itself: ``frozen`` leading rows of a table and, with ``freeze_params``, the dense model
parameters receive no step and keep their Adagrad state. Such steps take the eager path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bigembed.buckets import Batch
from bigembed.kernels.all_rows import whole_table_gradient
from bigembed.kernels.featurized_rows import (
    entity_rows,
    gather_table_side,
    routed,
    update_all_rows,
)
from bigembed.kernels.native.step import NativeStep
from bigembed.kernels.optimizers import dense_adagrad_update, row_adagrad_update
from bigembed.model import (
    BatchScores,
    FeatureBags,
    NegativeSettings,
    QueryBatch,
    ScoringModel,
    SideEmbeddings,
)


@dataclass
class Table:
    """One loaded partition of one entity type: embeddings and their row-Adagrad state.

    A featurized type's table holds its feature rows and ``bags`` the features of each entity
    (see :mod:`bigembed.kernels.featurized_rows`)."""

    emb: Tensor  # (N, D) float32, shared memory when Hogwild workers use it
    state: Tensor  # (N,) float32
    bags: FeatureBags | None = None


@dataclass
class StepStats:
    loss: float = 0.0
    reg: float = 0.0
    violators_lhs: int = 0
    violators_rhs: int = 0
    count: int = 0

    def add(self, other: StepStats) -> None:
        self.loss += other.loss
        self.reg += other.reg
        self.violators_lhs += other.violators_lhs
        self.violators_rhs += other.violators_rhs
        self.count += other.count


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
        native: NativeStep | None = None,
        freeze_params: bool = False,
    ) -> None:
        """``native``: the native step kernel for the batches it supports, as the run's kernel
        choice gives it (:meth:`bigembed.kernels.native.choice.KernelChoice.step_kernel`);
        None keeps every batch on the eager path. ``freeze_params``: the relation operators
        and global embeddings are never updated."""
        self.model = model
        self.params = [p for p in model.parameters()]
        self.model_states = model_states
        self.negs = negs
        self.lr = lr
        self.relation_lr = relation_lr
        self.gen = generator
        self.max_norm = model.spec.max_norm
        self.native = native
        self.freeze_params = freeze_params

    def _dense_update(self) -> None:
        """Adagrad on the dense parameters, or with ``freeze_params`` only their gradients
        dropped."""
        if self.freeze_params:
            for param in self.params:
                param.grad = None
            return
        dense_adagrad_update(self.params, self.model_states, self.relation_lr)

    def step(
        self, batch: Batch, lhs: Table, rhs: Table, frozen: tuple[int, int] = (0, 0)
    ) -> StepStats:
        """Train one batch; ``frozen``: how many leading rows of the lhs and rhs tables it
        must leave unchanged (embeddings and Adagrad state)."""
        if batch.side != "both":
            return self._query_step(batch, lhs, rhs, frozen)
        plain = lhs.bags is None and rhs.bags is None
        if self.native is not None and plain and frozen == (0, 0) and not self.freeze_params:
            done = self.native.step(
                batch, lhs.emb, lhs.state, rhs.emb, rhs.state, self.gen, self.lr
            )
            if done is not None:
                dense_adagrad_update(self.params, self.model_states, self.relation_lr)
                return StepStats(
                    loss=done.loss,
                    violators_lhs=done.violators_lhs,
                    violators_rhs=done.violators_rhs,
                    count=len(batch),
                )
        model = self.model
        rcfg = model.relation_spec(batch.relation_idx)
        all_negs = bool(rcfg.all_negs)
        lhs_side, lhs_uidx = gather_table_side(
            lhs, batch.lhs, self.negs, all_negs, self.gen, self.max_norm
        )
        rhs_side, rhs_uidx = gather_table_side(
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
            generator=self.gen,
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
            if all_negs:  # every row has a gradient: one dense row-Adagrad step per table
                self._update_all_rows(lhs, rhs, lhs_side, rhs_side, frozen)
                self._dense_update()
                return self._stats(scores, batch)
            lhs_updates = routed(lhs, _unfrozen(updates(lhs_side, lhs_uidx), frozen[0]))
            rhs_updates = routed(rhs, _unfrozen(updates(rhs_side, rhs_uidx), frozen[1]))
            if lhs.emb is rhs.emb:
                row_adagrad_update(lhs.emb, lhs.state, lhs_updates + rhs_updates, self.lr)
            else:
                row_adagrad_update(lhs.emb, lhs.state, lhs_updates, self.lr)
                row_adagrad_update(rhs.emb, rhs.state, rhs_updates, self.lr)
        self._dense_update()
        return self._stats(scores, batch)

    def _query_step(
        self, batch: Batch, lhs: Table, rhs: Table, frozen: tuple[int, int]
    ) -> StepStats:
        """A batch of edges that all train the query of one side (``train_type: KvsAll``): the
        edges sharing a query ``(given entity, relation)`` share one anchor and score row."""
        side = batch.side
        given_idx, target_idx = (batch.lhs, batch.rhs) if side == "rhs" else (batch.rhs, batch.lhs)
        given_tab, target_tab = (lhs, rhs) if side == "rhs" else (rhs, lhs)
        given_frozen, target_frozen = frozen if side == "rhs" else frozen[::-1]
        nrel = self.model.num_relations
        keys, query_of_edge = torch.unique(given_idx * nrel + batch.rel, return_inverse=True)
        query_given = torch.div(keys, nrel, rounding_mode="floor")
        queries = QueryBatch(
            side,
            entity_rows(given_tab, query_given, self.max_norm),
            keys - query_given * nrel,
            entity_rows(target_tab, None, self.max_norm),
            entity_rows(target_tab, target_idx, self.max_norm),
            target_idx,
            query_of_edge,
            batch.rel,
            batch.weight,
        )
        scores = self.model.query_loss(queries, self.gen)
        (scores.loss + scores.reg).backward()
        with torch.no_grad():
            whole = queries.whole.grad
            assert whole is not None
            if queries.targets.grad is not None:
                whole.index_add_(0, target_idx, queries.targets.grad)
            given_grad = queries.given.grad
            if given_tab.emb is target_tab.emb:
                if given_grad is not None:
                    whole.index_add_(0, query_given, given_grad)
            elif given_grad is not None:
                row_adagrad_update(
                    given_tab.emb,
                    given_tab.state,
                    routed(given_tab, _unfrozen([(query_given, given_grad)], given_frozen)),
                    self.lr,
                )
            update_all_rows(target_tab, whole, self.lr, target_frozen)
        self._dense_update()
        stats = self._stats(scores, batch)
        # Every edge is in one tail-query batch and one head-query batch per epoch: it counts
        # as trained in its tail-query batch.
        stats.count = len(batch) if side == "rhs" else 0
        return stats

    def _update_all_rows(
        self,
        lhs: Table,
        rhs: Table,
        lhs_side: SideEmbeddings,
        rhs_side: SideEmbeddings,
        frozen: tuple[int, int],
    ) -> None:
        """The dense update of :mod:`bigembed.kernels.all_rows` (both sides summed first when
        they share one table)."""
        grads = [whole_table_gradient(lhs_side), whole_table_gradient(rhs_side)]
        if lhs.emb is rhs.emb and grads[0] is not None and grads[1] is not None:
            grads = [grads[0].add_(grads[1]), None]
        for table, grad, f in zip((lhs, rhs), grads, frozen, strict=True):
            if grad is not None:
                update_all_rows(table, grad, self.lr, f)

    @staticmethod
    def _stats(scores: BatchScores, batch: Batch) -> StepStats:
        violators_lhs, violators_rhs = scores.violators()
        return StepStats(
            loss=float(scores.loss.detach()),
            reg=float(scores.reg.detach()),
            violators_lhs=violators_lhs,
            violators_rhs=violators_rhs,
            count=len(batch),
        )


def _unfrozen(updates: list[tuple[Tensor, Tensor]], first: int) -> list[tuple[Tensor, Tensor]]:
    """``updates`` without the rows below ``first`` (frozen rows get no step)."""
    if first <= 0:
        return updates
    kept = []
    for rows, grad in updates:
        keep = rows >= first
        if bool(keep.any()):
            kept.append((rows[keep], grad[keep]))
    return kept
