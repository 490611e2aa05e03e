"""The relation-prediction auxiliary objective (Chen et al. 2021): rank the true relation of an
edge among all relation types.

With all-entity training (``train_type: 1vsAll``/``KvsAll``, dynamic relations) each edge
``(h, r, t)`` also adds ``w · CE(r | h, ?, t)``: the softmax cross-entropy of ``r`` among the
scores ``c(op_lhs[r'](h), t)`` of every relation ``r'``, with the tail-query operator and the
comparator the model scores edges with. The relation scores are computed through the operator
(``h`` repeated once per relation, every relation's parameters applied at once), so any
operator works; for ComplEx/DistMult with the dot comparator they are one product of the
features ``h ∘ t`` with every relation's parameters. Gradients flow to ``h``, ``t`` and
every relation's parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from bigembed.model.comparators import Comparator, DotComparator
from bigembed.model.operators import ComplexDiagonalOperator, DiagonalOperator, Operator


def relation_scores(op: Operator, cmp: Comparator, h: Tensor, t: Tensor, nrel: int) -> Tensor:
    """``(E, nrel)`` scores ``c(prepare(op(h_e, r)), t_e)`` of every relation ``r`` for each
    edge's ``h`` (E, D) (adjusted, before its operator) and ``t`` (E, D) (prepared).

    With the plain dot comparator, DistMult and ComplEx take one ``(E, D) x (D, nrel)``
    product of the features ``h ∘ t`` (ComplEx: ``h ∘ conj t``) with every relation's
    parameters; any other operator or comparator scores ``h`` repeated once per relation
    (:func:`general_relation_scores`, ``E · nrel`` rows)."""
    if type(cmp) is DotComparator:
        if isinstance(op, DiagonalOperator):
            return (h * t) @ op.diagonal.t()
        if isinstance(op, ComplexDiagonalOperator):
            half = h.shape[1] // 2
            hr, hi, tr, ti = h[:, :half], h[:, half:], t[:, :half], t[:, half:]
            feats = torch.cat([hr * tr + hi * ti, hr * ti - hi * tr], 1)
            return feats @ torch.cat([op.real, op.imag], 1).t()
    return general_relation_scores(op, cmp, h, t, nrel)


def general_relation_scores(
    op: Operator, cmp: Comparator, h: Tensor, t: Tensor, nrel: int
) -> Tensor:
    """:func:`relation_scores` through the operator itself, for any operator and comparator."""
    edges = h.shape[0]
    rels = torch.arange(nrel).repeat(edges)
    anchors = cmp.prepare(op(h.repeat_interleave(nrel, 0), rels))
    return cmp.pos(anchors, t.repeat_interleave(nrel, 0)).view(edges, nrel)


def relation_prediction_loss(
    op: Operator,
    cmp: Comparator,
    h: Tensor,
    t: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    nrel: int,
) -> Tensor:
    """Σ_e w_e (logsumexp_r' s_e[r'] - s_e[rel_e]): the summed (edge-weighted) cross-entropy
    of each edge's relation among all ``nrel`` relation types (scores: :func:`relation_scores`)."""
    scores = relation_scores(op, cmp, h, t, nrel)
    per_edge = F.cross_entropy(scores, rel.long(), reduction="none")
    if weight is not None:
        per_edge = per_edge * weight
    return per_edge.sum()
