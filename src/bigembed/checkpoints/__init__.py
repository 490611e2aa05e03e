"""Checkpoints: the one owner of a checkpoint directory, used by training, inference, conversion
and the distributed trainer alike.

* :mod:`~bigembed.checkpoints.metadata`: the typed, versioned metadata record of one version
  (:class:`~bigembed.checkpoints.metadata.CheckpointMetadata`) and its JSON form;
* :mod:`~bigembed.checkpoints.store`: :class:`CheckpointStore` and the writer's protocol (open
  for training, write version N+1, commit; discard what an interrupted step left), with its
  parts: :mod:`~bigembed.checkpoints.layout` (the on-disk names),
  :mod:`~bigembed.checkpoints.partition_files`, :mod:`~bigembed.checkpoints.logs` (stats and
  validation records) and :mod:`~bigembed.checkpoints.snapshots` (``epoch_N/``, ``best/``);
* :mod:`~bigembed.checkpoints.reading`: a trained model read back for inference, and the entity
  store that goes with it;
* :mod:`~bigembed.checkpoints.tables`: its embedding tables, one partition at a time, cached.
"""

from bigembed.checkpoints.inference import DEFAULT_CACHE_BYTES, open_for_inference
from bigembed.checkpoints.layout import VERSION_FILE
from bigembed.checkpoints.metadata import CheckpointMetadata, IterationPosition, check_same_import
from bigembed.checkpoints.reading import (
    TrainedModel,
    checkpoint_dir,
    load_trained,
    open_entity_store,
)
from bigembed.checkpoints.store import CheckpointStore
from bigembed.checkpoints.tables import EntityTables

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "VERSION_FILE",
    "CheckpointMetadata",
    "CheckpointStore",
    "EntityTables",
    "IterationPosition",
    "TrainedModel",
    "check_same_import",
    "checkpoint_dir",
    "load_trained",
    "open_entity_store",
    "open_for_inference",
]
