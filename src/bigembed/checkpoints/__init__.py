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
* :mod:`~bigembed.checkpoints.tables`: its embedding tables, one partition at a time, cached;
* :mod:`~bigembed.checkpoints.compatibility`: whether a checkpoint fits the config about to
  resume it (model-shaping keys compared first), :mod:`~bigembed.checkpoints.start_over`:
  ``train --fresh``.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
