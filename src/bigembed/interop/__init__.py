"""Moving checkpoints between bigembed and other systems (PyTorch-BigGraph)."""

from bigembed.interop.pbg import from_pbg, to_pbg

__all__ = ["from_pbg", "to_pbg"]
