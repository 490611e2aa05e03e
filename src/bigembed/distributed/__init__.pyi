from .auth import add_security_arguments, apply_security_arguments
from .rank_main import serve_partitions, train_distributed

__all__ = [
    "add_security_arguments",
    "apply_security_arguments",
    "serve_partitions",
    "train_distributed",
]
