from .edge_input import EdgeLoader, FileOptions
from .evaluation import Evaluation, evaluate_checkpoint, prepare_evaluation
from .report import EvalReport
from .shares import edge_costs, eval_shares, merge_rankings

__all__ = [
    "EdgeLoader",
    "EvalReport",
    "Evaluation",
    "FileOptions",
    "edge_costs",
    "eval_shares",
    "evaluate_checkpoint",
    "merge_rankings",
    "prepare_evaluation",
]
