from .edge_input import EdgeLoader, FileOptions
from .report import evaluate_checkpoint

__all__ = ["EdgeLoader", "FileOptions", "evaluate_checkpoint"]
