from .auth import add_security_arguments, apply_security_arguments
from .eval_rank import RankEval, eval_distributed
from .launch_env import LaunchEnv, Placement, place, read_launch_env
from .rank_main import serve_partitions, train_distributed
from .store import host_agent_store

__all__ = [
    "LaunchEnv",
    "Placement",
    "RankEval",
    "add_security_arguments",
    "apply_security_arguments",
    "eval_distributed",
    "host_agent_store",
    "place",
    "read_launch_env",
    "serve_partitions",
    "train_distributed",
]
