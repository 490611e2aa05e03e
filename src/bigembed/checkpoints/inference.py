"""A trained model opened for inference: checkpoint, entity names and embedding tables together.

The query API, export and conversion need the same three things, opened in the same order and
checked against each other; :func:`open_for_inference` does that once. The parts themselves
belong to the checkpoint package, where evaluation (a lower layer) uses them directly:

* :func:`bigembed.checkpoints.reading.load_trained` reads the last committed version (metadata
  record, model, memory-mapped embeddings) and turns every way a checkpoint can be broken into
  one :class:`~bigembed.errors.CheckpointError` naming the path;
* :func:`bigembed.checkpoints.reading.open_entity_store` opens the entity names and checks that
  they are the import the model was trained on, with the same partition counts;
* :class:`bigembed.checkpoints.tables.EntityTables` hands out one partition's embeddings at a
  time, cached within a memory budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bigembed.checkpoints.reading import TrainedModel, load_trained, open_entity_store
from bigembed.checkpoints.tables import DEFAULT_CACHE_BYTES, EntityTables
from bigembed.storage import EntityStore

__all__ = ["DEFAULT_CACHE_BYTES", "Inference", "open_for_inference"]


@dataclass(frozen=True)
class Inference:
    """A trained model, the entity store whose names go with its rows, and its tables."""

    trained: TrainedModel
    entities: EntityStore
    tables: EntityTables


def open_for_inference(
    checkpoint_dir: str | os.PathLike[str],
    entity_path: str | os.PathLike[str] | None = None,
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> Inference:
    """Open the last committed version in ``checkpoint_dir`` with its entity store.

    ``entity_path`` None means the checkpoint config's; ``cache_bytes`` bounds the embedding
    tables kept in memory (0: each partition is read when asked for and not kept).
    """
    trained = load_trained(checkpoint_dir)
    entities = open_entity_store(trained, entity_path)
    return Inference(trained, entities, EntityTables(trained, max_bytes=cache_bytes))
