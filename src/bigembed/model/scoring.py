"""The multi-relation scoring model: operators + comparator + loss over gathered embeddings.

Entity embedding tables live outside the model (in a partition store, possibly on disk); the
trainer gathers the rows a batch needs and hands them here as leaf tensors, so gradients land
on exactly those rows and a fused row-wise Adagrad can apply them (see
:func:`bigembed.kernels.optimizers.row_adagrad_update`). Relation parameters and global
embeddings are ordinary ``nn.Parameter`` objects of this module.

Standard mode (PBG's non-dynamic relations): each batch holds one relation type; its operator
transforms the rhs side, and both sides are corrupted: lhs negatives are compared raw with
``op(rhs)``, rhs negatives go through the operator like the positive did.

Dynamic mode: one lhs and one rhs operator set, one parameter row per relation type; each edge is
scored twice, ``c(lhs, op_rhs[r](rhs))`` against corrupted lhs and ``c(rhs, op_lhs[r](lhs))``
against corrupted rhs, so negatives never pass through a per-edge operator.

What a batch carries in and out is :mod:`bigembed.model.batch`; each corrupted side is scored by
one of the paths of :mod:`bigembed.model.side_scoring` (score blocks, the fused sampled loss or
the all-entity softmax), chosen in :meth:`ScoringModel.forward`.
"""

from __future__ import annotations

from functools import partial
from typing import cast

import torch
from torch import Tensor, nn

from bigembed.model.all_entities import all_entity_softmax_loss
from bigembed.model.batch import (
    BatchScores,
    Corruption,
    NegativeSettings,
    QueryBatch,
    SideEmbeddings,
)
from bigembed.model.comparators import (
    Comparator,
    CosComparator,
    DotComparator,
    make_comparator,
)
from bigembed.model.dtype_choice import DtypeChoice, choose_compute_dtype
from bigembed.model.fused import LOSS_KINDS
from bigembed.model.losses import make_loss
from bigembed.model.operators import IdentityOperator, Operator, ParamDropout, make_operator
from bigembed.model.relation_prediction import relation_prediction_loss
from bigembed.model.side_scoring import (
    all_entities_side_loss,
    fused_side_loss,
    negative_score_blocks,
)
from bigembed.model.spec import ModelSpec, RelationSpec


def _inverted_dropout(x: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """``x`` with each coordinate zeroed with probability ``p`` and the others scaled by
    ``1 / (1 - p)``, the mask drawn from ``generator``; ``x`` when ``generator`` is None
    (evaluation) or ``p`` is 0."""
    if generator is None or p == 0:
        return x
    mask = torch.empty(x.shape, dtype=x.dtype).bernoulli_(1 - p, generator=generator)
    return x * mask.mul_(1 / (1 - p))


def _operator(operators: nn.ModuleList, idx: int) -> Operator:
    """``operators[idx]``: the lists hold only operators (made by ``make_operator``), which
    ``nn.ModuleList`` indexing, typed ``Module``, cannot say."""
    return cast(Operator, operators[idx])


class ScoringModel(nn.Module):
    """Operators, comparator and loss of one :class:`ModelSpec` (kept as ``self.spec``)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.dynamic = spec.dynamic_relations
        self.num_relations = spec.num_relations
        self.comparator: Comparator = make_comparator(spec.comparator, spec.bias)
        self.loss_fn = make_loss(spec.loss, spec.margin)
        # Decided once here: _fusable runs every batch.
        self.fusable_loss = spec.loss in LOSS_KINDS and type(self.comparator) in (
            DotComparator,
            CosComparator,
        )
        self.all_entities_kernel = self.fusable_loss and spec.loss == "softmax"
        self.reg_coef = float(spec.regularization_coef)
        self.reg_factors = spec.regularizer == "N3_factors"
        self.entity_dropout = float(spec.entity_dropout)
        self.relation_dropout = float(spec.relation_dropout)
        self.dropout = self.entity_dropout > 0 or self.relation_dropout > 0
        # auto: decided once per process from this machine (bigembed.model.dtype_choice)
        self.dtype_choice = choose_compute_dtype(spec.compute_dtype)
        self.compute_dtype = self.dtype_choice.dtype
        self.relpred_weight = float(spec.relation_prediction_weight)
        # One generator for every operator, in construction order: the same seed gives the
        # same operators in every process that builds the model (Hogwild, distributed ranks).
        init = spec.relation_init_scale
        gen = torch.Generator().manual_seed(spec.seed) if init is not None else None
        if self.dynamic:
            (rel,) = spec.relations
            n = self.num_relations
            self.lhs_operators = nn.ModuleList(
                [make_operator(rel.operator, spec.dimension(rel.lhs), n, init, gen)]
            )
            self.rhs_operators = nn.ModuleList(
                [make_operator(rel.operator, spec.dimension(rel.rhs), n, init, gen)]
            )
        else:
            self.lhs_operators = nn.ModuleList()
            self.rhs_operators = nn.ModuleList(
                [
                    make_operator(r.operator, spec.dimension(r.rhs), None, init, gen)
                    for r in spec.relations
                ]
            )
        self.global_embs = nn.ParameterDict()
        if spec.global_emb:
            for etype, dim in spec.entity_dims.items():
                self.global_embs[etype] = nn.Parameter(torch.zeros(dim))

    # ------------------------------------------------------------------ helpers
    def use_dtype(self, choice: DtypeChoice) -> None:
        """Run the score products in ``choice``'s dtype from now on."""
        self.dtype_choice = choice
        self.compute_dtype = choice.dtype

    def relation_spec(self, relation_idx: int) -> RelationSpec:
        """The relation ``relation_idx`` (dynamic mode: the template all ids share)."""
        return self.spec.relation(relation_idx)

    def _adjust(self, x: Tensor, etype: str) -> Tensor:
        """Add the type's global embedding (if any)."""
        if etype in self.global_embs:
            return x + self.global_embs[etype]
        return x

    def rhs_operator(self, relation_idx: int) -> Operator:
        return _operator(self.rhs_operators, 0 if self.dynamic else relation_idx)

    def lhs_operator(self) -> Operator:
        return _operator(self.lhs_operators, 0) if self.dynamic else IdentityOperator(0)

    # ------------------------------------------------------------------ scoring
    def negative_blocks(
        self, side: Corruption, negs: NegativeSettings, all_negs: bool
    ) -> list[Tensor]:
        """The negative score blocks of one corrupted side, as :meth:`forward` builds them."""
        return negative_score_blocks(self.comparator, self.compute_dtype, side, negs, all_negs)

    def self_negative(self, negs: NegativeSettings, relation_idx: int) -> bool:
        """Whether the batches of ``relation_idx`` score the query entity as a negative
        (``self_negative``; ``auto``: when the relation's lhs and rhs types are the same).
        Never with ``all_negs``, which scores every entity already."""
        rspec = self.relation_spec(relation_idx)
        if rspec.all_negs:
            return False
        if negs.self_negative == "auto":
            return rspec.lhs == rspec.rhs
        return bool(negs.self_negative)

    def _fusable(self, negs: NegativeSettings, all_negs: bool) -> bool:
        """Whether the fused sampled loss computes this loss (over dot products)."""
        return self.fusable_loss and not all_negs and negs.num_uniform_negs > 0

    def _anchor(
        self, op: Operator, x: Tensor, rel: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """The query anchor ``op(x, rel)`` of a dynamic relation, with entity dropout on ``x``
        and relation dropout on the operator's parameter rows picked for ``rel`` (training:
        ``generator`` set; the masks are drawn in that order)."""
        drop: ParamDropout | None = None
        if generator is not None and self.relation_dropout > 0:
            drop = partial(_inverted_dropout, p=self.relation_dropout, generator=generator)
        return op(_inverted_dropout(x, self.entity_dropout, generator), rel, drop)

    def _reg(
        self, operator: Operator, src: Tensor, dst: Tensor, rel: Tensor | None, chunks: int
    ) -> Tensor:
        if self.reg_coef == 0:
            return src.new_zeros(())
        total = operator.reg_embeddings_sum(src) + operator.reg_embeddings_sum(dst)
        params = operator.reg_params_sum(rel)
        if params is not None:
            # Standard mode counts the (shared) parameters once per chunk, as PBG does.
            total = total + params * (1 if rel is not None else chunks)
        return self.reg_coef * total

    def corrupted_sides(
        self,
        lhs: SideEmbeddings,
        rhs: SideEmbeddings,
        rel: Tensor,
        relation_idx: int,
        negs: NegativeSettings,
    ) -> list[Corruption]:
        """The batch's two corrupted sides (lhs, rhs) as :meth:`forward` scores them: for
        scoring the negatives elsewhere (the tiled ranking of the withheld-edge eval)."""
        return self._corrupt(lhs, rhs, rel, relation_idx, negs)[0]

    def _corrupt(
        self,
        lhs: SideEmbeddings,
        rhs: SideEmbeddings,
        rel: Tensor,
        relation_idx: int,
        negs: NegativeSettings,
        generator: torch.Generator | None = None,
    ) -> tuple[list[Corruption], Tensor]:
        """The two corrupted sides and the regularizer term of a batch (``generator``: the
        entity dropout masks of training, :meth:`_dropout`)."""
        rspec = self.relation_spec(relation_idx)
        cmp = self.comparator
        lhs_x = self._adjust(lhs.pos, rspec.lhs)
        rhs_x = self._adjust(rhs.pos, rspec.rhs)
        batch = lhs_x.shape[0]
        chunks = -(-batch // max(1, negs.num_batch_negs or negs.num_uniform_negs or batch))

        def prep_neg(x: Tensor | None, etype: str, op: Operator | None) -> Tensor | None:
            if x is None:
                return None
            x = self._adjust(x, etype)
            if op is not None:
                x = op(x)
            return cmp.prepare(x)

        def corruption(
            pos: Tensor,
            src: Tensor,
            side: SideEmbeddings,
            etype: str,
            neg_op: Operator | None,
            anchors: Tensor,
            enabled: bool,
        ) -> Corruption:
            uniform = prep_neg(side.uniform, etype, neg_op)
            whole = prep_neg(side.all, etype, neg_op)
            return Corruption(pos, src, uniform, whole, side.pos_idx, anchors, enabled)

        if not self.dynamic:
            op = self.rhs_operator(relation_idx)
            lhs_p = cmp.prepare(lhs_x)
            rhs_t = cmp.prepare(op(rhs_x))
            lhs_pos = rhs_pos = cmp.pos(lhs_p, rhs_t)
            sides = [
                corruption(lhs_pos, lhs_p, lhs, rspec.lhs, None, rhs_t, not negs.disable_lhs),
                corruption(rhs_pos, rhs_t, rhs, rspec.rhs, op, lhs_p, not negs.disable_rhs),
            ]
            reg_rhs = cmp.prepare(rhs_x) if self.reg_factors else rhs_t
            reg = self._reg(op, lhs_p, reg_rhs, None, chunks)
        else:
            rhs_op, lhs_op = self.rhs_operator(0), self.lhs_operator()
            lhs_p = cmp.prepare(lhs_x)
            rhs_p = cmp.prepare(rhs_x)
            # Each side is the anchor (given entity) of the other side's corruption: entity
            # dropout applies to it there, not where it is the true answer.
            rhs_t = cmp.prepare(self._anchor(rhs_op, rhs_x, rel, generator))
            lhs_t = cmp.prepare(self._anchor(lhs_op, lhs_x, rel, generator))
            lhs_pos = cmp.pos(lhs_p, rhs_t)
            rhs_pos = cmp.pos(rhs_p, lhs_t)
            sides = [
                corruption(lhs_pos, lhs_p, lhs, rspec.lhs, None, rhs_t, not negs.disable_lhs),
                corruption(rhs_pos, rhs_p, rhs, rspec.rhs, None, lhs_t, not negs.disable_rhs),
            ]
            if self.reg_factors:
                reg_l, reg_r = rhs_p, lhs_p
            elif generator is not None and self.dropout:
                # The penalty is on the parameters, not on the dropped-out copies.
                reg_l = cmp.prepare(rhs_op(rhs_x, rel))
                reg_r = cmp.prepare(lhs_op(lhs_x, rel))
            else:
                reg_l, reg_r = rhs_t, lhs_t
            reg = self._reg(rhs_op, lhs_p, reg_l, rel, chunks) + self._reg(
                lhs_op, rhs_p, reg_r, rel, chunks
            )

        if self.self_negative(negs, relation_idx):
            # h == t: the same offset and the same row (offsets of two different partitions
            # can coincide; their rows do not).
            same = (lhs.pos_idx == rhs.pos_idx) & (lhs.pos == rhs.pos).all(dim=1)
            # The query entity as a candidate of the corrupted side, transformed as that side's
            # negatives are (standard mode: rhs candidates go through the operator).
            head_as_tail = self._adjust(lhs.pos, rspec.rhs)
            if not self.dynamic:
                head_as_tail = self.rhs_operator(relation_idx)(head_as_tail)
            tail_as_head = cmp.prepare(self._adjust(rhs.pos, rspec.lhs))
            sides = [
                sides[0]._replace(self_rows=tail_as_head, self_mask=same),
                sides[1]._replace(self_rows=cmp.prepare(head_as_tail), self_mask=same),
            ]
        return sides, reg

    def _relation_prediction(
        self, h: Tensor, t: Tensor, rel: Tensor, weight: Tensor | None
    ) -> Tensor:
        """The weighted relation-prediction loss of edges (h, rel, t), ``h`` and ``t`` raw
        gathered rows of the template relation's lhs and rhs types
        (:mod:`bigembed.model.relation_prediction`)."""
        rspec = self.relation_spec(0)
        cmp = self.comparator
        h = self._adjust(h, rspec.lhs)
        t = cmp.prepare(self._adjust(t, rspec.rhs))
        loss = relation_prediction_loss(
            self.lhs_operator(), cmp, h, t, rel, weight, self.num_relations
        )
        return loss * self.relpred_weight

    def forward(
        self,
        lhs: SideEmbeddings,
        rhs: SideEmbeddings,
        rel: Tensor,
        relation_idx: int,
        weight: Tensor | None,
        negs: NegativeSettings,
        need_scores: bool = True,
        generator: torch.Generator | None = None,
    ) -> BatchScores:
        """Score a batch; ``rel`` holds per-edge relation ids (used in dynamic mode only).
        ``generator`` (training only) draws the entity dropout masks.

        With ``need_scores=False`` (training) the loss may be computed by the fused kernel,
        which keeps no negative score blocks (``lhs_neg``/``rhs_neg`` are empty and the
        violator counts are filled in instead).
        """
        rspec = self.relation_spec(relation_idx)
        all_negs = bool(rspec.all_negs)
        fused = not need_scores and self._fusable(negs, all_negs)
        # The all-entity kernel is a softmax: other fusable losses take the score-block path.
        fused_all = not need_scores and all_negs and self.all_entities_kernel
        sides, reg = self._corrupt(lhs, rhs, rel, relation_idx, negs, generator)
        lhs_pos, rhs_pos = sides[0].pos, sides[1].pos

        if fused or fused_all:
            dtype, kind, margin = self.compute_dtype, self.spec.loss, float(self.spec.margin)
            (loss_l, viol_l), (loss_r, viol_r) = (
                all_entities_side_loss(side, weight, dtype)
                if fused_all
                else fused_side_loss(side, negs, weight, dtype, kind, margin)
                for side in sides
            )
            loss = (loss_l + loss_r) * float(rspec.weight)
            if fused_all and self.dynamic and self.relpred_weight:
                loss = loss + self._relation_prediction(lhs.pos, rhs.pos, rel, weight)
            return BatchScores(loss, reg, lhs_pos, [], rhs_pos, [], (viol_l, viol_r))
        lhs_neg, rhs_neg = (self.negative_blocks(side, negs, all_negs) for side in sides)
        loss = self.loss_fn(lhs_pos, lhs_neg, weight) + self.loss_fn(rhs_pos, rhs_neg, weight)
        loss = loss * float(rspec.weight)
        return BatchScores(loss, reg, lhs_pos, lhs_neg, rhs_pos, rhs_neg)

    def query_loss(
        self, queries: QueryBatch, generator: torch.Generator | None = None
    ) -> BatchScores:
        """The 1-vs-all softmax loss of a batch of grouped queries (``train_type: KvsAll``,
        dynamic relations only): every distinct query of one side scored once against all
        candidates, each of its edges' true entities a positive.

        Loss, gradients and N3 terms are those of the per-edge 1-vs-all path restricted to the
        queries' side (:meth:`forward` with the other side disabled), summed over the batch's
        edges: the anchor term of the regulariser counts once per edge. ``generator``
        (training only) draws the entity dropout mask, one per distinct query.
        """
        if not self.dynamic or not self.all_entities_kernel:
            raise ValueError("grouped queries need dynamic relations, softmax and dot or cos")
        rspec = self.relation_spec(0)
        cmp = self.comparator
        # Tail queries (h, r, ?) use the lhs operators, head queries (?, r, t) the rhs ones.
        if queries.side == "rhs":
            op, given_type, target_type = self.lhs_operator(), rspec.lhs, rspec.rhs
        else:
            op, given_type, target_type = self.rhs_operator(0), rspec.rhs, rspec.lhs
        given = self._adjust(queries.given, given_type)
        anchors = cmp.prepare(self._anchor(op, given, queries.query_rel, generator))
        candidates = cmp.prepare(self._adjust(queries.whole, target_type))
        loss, violators = all_entity_softmax_loss(
            anchors,
            candidates,
            queries.target_idx,
            queries.weight,
            self.compute_dtype,
            rows=queries.query_of_edge,
        )
        loss = loss * float(rspec.weight)
        if queries.side == "rhs" and self.relpred_weight:
            # Each edge is in one tail-query batch per epoch: its relation is predicted there.
            h = queries.given.index_select(0, queries.query_of_edge)
            loss = loss + self._relation_prediction(h, queries.targets, queries.rel, queries.weight)
        per_edge_anchors = anchors.index_select(0, queries.query_of_edge)
        targets = cmp.prepare(self._adjust(queries.targets, target_type))
        if self.reg_factors:
            reg_anchors = cmp.prepare(given).index_select(0, queries.query_of_edge)
        elif generator is not None and self.dropout:
            # The penalty is on the parameters, not on the dropped-out copies.
            reg_anchors = cmp.prepare(op(given, queries.query_rel))
            reg_anchors = reg_anchors.index_select(0, queries.query_of_edge)
        else:
            reg_anchors = per_edge_anchors
        reg = self._reg(op, targets, reg_anchors, queries.rel, 1)
        pos = cmp.pos(targets.detach(), per_edge_anchors.detach())
        none = pos.new_zeros(0)
        if queries.side == "rhs":
            return BatchScores(loss, reg, none, [], pos, [], (0, violators))
        return BatchScores(loss, reg, pos, [], none, [], (violators, 0))
