"""Training on many machines: launcher, ranks, lock / partition / rendezvous servers."""

from bigembed.distributed.auth import add_security_arguments, apply_security_arguments
from bigembed.distributed.rank_main import serve_partitions, train_distributed

__all__ = [
    "add_security_arguments",
    "apply_security_arguments",
    "serve_partitions",
    "train_distributed",
]
