from .directions import direction, pair_scores
from .filters import KnownEdges
from .full import SIDES, EvalEdges, RankingResult, SideRanks, rank_edges
from .metrics import RankingSums, summarize, summarize_groups
from .sampled import EvalPlan, SideCounts, UnitResult, eval_unit, evaluate_edges, score_batches

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
