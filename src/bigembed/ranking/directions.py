"""How a trained model scores one side of an edge against candidates: anchors and candidates.

Predicting (ranking) the ``rhs`` of ``(lhs, r, ?)`` or the ``lhs`` of ``(?, r, rhs)`` compares an
*anchor* built from the given entity with every *candidate* of the predicted side, exactly as
training scores corrupted edges (see :mod:`bigembed.model.scoring`):

=========  ==========  ======================================  ===================================
mode       predicted   anchor (from the given entity x)        candidate y
=========  ==========  ======================================  ===================================
standard   rhs         prepare(x + g)                          prepare(op_r(y + g))
standard   lhs         prepare(op_r(x + g))                    prepare(y + g)
dynamic    rhs         prepare(op_lhs[r](x))                   prepare(y)
dynamic    lhs         prepare(op_rhs[r](x))                   prepare(y)
=========  ==========  ======================================  ===================================

(``g`` is the type's global embedding, if any; ``prepare`` the comparator's, e.g. unit norm for
``cos``). The score is ``comparator(anchor, candidate)``. In standard mode both directions give
the same score for an edge; in dynamic mode they are the model's two (reciprocal) scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from bigembed.model import ScoringModel


@dataclass
class Direction:
    """Scoring of the ``side`` of relation ``relation`` (see the module docstring)."""

    side: str  # the predicted side: "lhs" or "rhs"
    relation: int  # the relation (standard mode) or -1 (dynamic: any relation, ids per row)
    target_type: str  # entity type of the candidates
    source_type: str  # entity type of the given entity
    anchors: Callable[[Tensor, Tensor | None], Tensor]  # (stored rows, relation ids) -> anchors
    candidates: Callable[[Tensor], Tensor]  # stored rows -> prepared candidates


def other(side: str) -> str:
    return "rhs" if side == "lhs" else "lhs"


def direction(model: ScoringModel, side: str, relation: int) -> Direction:
    """The :class:`Direction` predicting ``side`` of ``relation`` (any id in dynamic mode)."""
    if side not in ("lhs", "rhs"):
        raise ValueError(f"side must be 'lhs' or 'rhs', not {side!r}")
    cmp = model.comparator
    rcfg = model.relation_spec(relation)
    target = rcfg.lhs if side == "lhs" else rcfg.rhs
    source = rcfg.rhs if side == "lhs" else rcfg.lhs

    def adjust(x: Tensor, etype: str) -> Tensor:
        return model._adjust(x, etype)

    if model.dynamic:
        op = model.lhs_operators[0] if side == "rhs" else model.rhs_operators[0]

        def dyn_anchors(x: Tensor, rel: Tensor | None) -> Tensor:
            if rel is None:
                raise ValueError("dynamic relations need a relation id per row")
            return cmp.prepare(op(adjust(x, source), rel))

        return Direction(
            side, -1, target, source, dyn_anchors, lambda y: cmp.prepare(adjust(y, target))
        )

    op = model.rhs_operator(relation)
    if side == "rhs":
        return Direction(
            side,
            relation,
            target,
            source,
            lambda x, rel: cmp.prepare(adjust(x, source)),
            lambda y: cmp.prepare(op(adjust(y, target))),
        )
    return Direction(
        side,
        relation,
        target,
        source,
        lambda x, rel: cmp.prepare(op(adjust(x, source))),
        lambda y: cmp.prepare(adjust(y, target)),
    )


def pair_scores(model: ScoringModel, anchors: Tensor, candidates: Tensor) -> Tensor:
    """Scores of matching rows, with the formula the ranking uses for candidate matrices."""
    return model.comparator.neg(anchors.unsqueeze(1), candidates.unsqueeze(1)).reshape(-1)
