"""bigembed: embeddings of huge multi-relation graphs (a PyTorch-BigGraph successor)."""

__version__ = "0.1.0"
