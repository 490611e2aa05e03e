"""``bigembed.load``: a trained checkpoint opened for queries."""

from __future__ import annotations

import os

from bigembed.checkpoints import DEFAULT_CACHE_BYTES, open_for_inference
from bigembed.serving.model import EmbeddingModel


def load(
    checkpoint_dir: str | os.PathLike[str],
    entity_path: str | os.PathLike[str] | None = None,
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> EmbeddingModel:
    """Open the last checkpoint in ``checkpoint_dir`` for queries.

    ``entity_path`` (the names) defaults to the one in the checkpoint's config. Embeddings are
    read lazily, one partition at a time, and kept within ``cache_bytes``.

    >>> model = bigembed.load("work/fb15k237/model")
    >>> model.entity_types
    ['all']
    """
    opened = open_for_inference(checkpoint_dir, entity_path, cache_bytes=cache_bytes)
    return EmbeddingModel(opened.trained, opened.entities, opened.tables)
