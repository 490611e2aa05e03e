"""``bigembed eval``: filtered link-prediction reports of a checkpoint, full or sampled."""

from bigembed.eval.edge_input import EdgeLoader, FileOptions
from bigembed.eval.report import evaluate_checkpoint

__all__ = ["EdgeLoader", "FileOptions", "evaluate_checkpoint"]
