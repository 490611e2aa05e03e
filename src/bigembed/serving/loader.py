"""``bigembed.load``: a trained checkpoint opened for queries."""

from __future__ import annotations

import logging
import os

from bigembed.checkpoints import DEFAULT_CACHE_BYTES, choose_version, open_for_inference
from bigembed.serving.model import EmbeddingModel

logger = logging.getLogger(__name__)


def load(
    checkpoint_dir: str | os.PathLike[str],
    entity_path: str | os.PathLike[str] | None = None,
    *,
    version: str | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> EmbeddingModel:
    """Open a checkpoint in ``checkpoint_dir`` for queries.

    ``version``: "best" (the version early stopping kept in ``checkpoint_dir/best``), "latest"
    (the last committed version) or None, the default: "best" when early stopping kept one
    (logged at INFO, one line naming both versions), else "latest", as the command line does.
    ``entity_path`` (the names) defaults to the one in the checkpoint's config. Embeddings are
    read lazily, one partition at a time, and kept within ``cache_bytes``.

    >>> model = bigembed.load("work/fb15k237/model")
    >>> model.entity_types
    ['all']
    >>> bigembed.load("work/friends/model", version="latest").trained.version
    12
    """
    chosen = choose_version(checkpoint_dir, version)
    if chosen.note is not None:
        hint = " (version='latest' reads it)" if chosen.latest_differs else ""
        logger.info("%s%s", chosen.note, hint)
    opened = open_for_inference(chosen.directory, entity_path, cache_bytes=cache_bytes)
    return EmbeddingModel(opened.trained, opened.entities, opened.tables)
