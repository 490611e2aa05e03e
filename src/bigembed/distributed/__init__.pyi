from .auth import add_security_arguments, apply_security_arguments
from .eval_rank import RankEval, eval_distributed
from .launch_env import LaunchEnv, Placement, place, read_launch_env
from .rank_main import serve_partitions, train_distributed

__all__ = [
    "LaunchEnv",
    "Placement",
    "RankEval",
    "add_security_arguments",
    "apply_security_arguments",
    "eval_distributed",
    "place",
    "read_launch_env",
    "serve_partitions",
    "train_distributed",
]
