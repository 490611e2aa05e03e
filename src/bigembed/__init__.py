"""bigembed: embeddings of huge multi-relation graphs (a PyTorch-BigGraph successor).

``bigembed.load(checkpoint_dir)`` opens a trained model for queries (see
:mod:`bigembed.serving`); it is imported on first use, so ``import bigembed`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["__version__", "load"]

if TYPE_CHECKING:
    from bigembed.serving import load


def __getattr__(name: str) -> Any:
    if name == "load":
        from bigembed.serving import load

        return load
    raise AttributeError(f"module 'bigembed' has no attribute {name!r}")
