"""Checkpoints: the versioned on-disk format, committing and discarding versions, and reading
a trained model back for inference (used by training, inference, conversion and the
distributed trainer alike)."""
