from .auth import add_security_arguments, apply_security_arguments
from .eval_rank import RankEval, eval_distributed
from .rank_main import serve_partitions, train_distributed

__all__ = [
    "RankEval",
    "add_security_arguments",
    "apply_security_arguments",
    "eval_distributed",
    "serve_partitions",
    "train_distributed",
]
