"""Everything that ranks and measures: sampled ranking, full filtered ranking, the metrics."""

from bigembed.ranking.directions import direction, pair_scores
from bigembed.ranking.filters import KnownEdges
from bigembed.ranking.full import SIDES, EvalEdges, RankingResult, SideRanks, rank_edges
from bigembed.ranking.metrics import RankingSums, summarize, summarize_groups
from bigembed.ranking.sampled import (
    EvalPlan,
    SideCounts,
    UnitResult,
    eval_unit,
    evaluate_edges,
    score_batches,
)

__all__ = [
    "SIDES",
    "EvalEdges",
    "EvalPlan",
    "KnownEdges",
    "RankingResult",
    "RankingSums",
    "SideCounts",
    "SideRanks",
    "UnitResult",
    "direction",
    "eval_unit",
    "evaluate_edges",
    "pair_scores",
    "rank_edges",
    "score_batches",
    "summarize",
    "summarize_groups",
]
