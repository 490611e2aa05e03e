"""Checkpoints: the one owner of a checkpoint directory, used by training, inference, conversion
and the distributed trainer alike.

* :mod:`~bigembed.checkpoints.metadata`: the typed, versioned metadata record of one version
  (:class:`~bigembed.checkpoints.metadata.CheckpointMetadata`) and its JSON form;
* :mod:`~bigembed.checkpoints.store`: the on-disk layout and the writer's protocol (open for
  training, write version N+1, commit; discard what an interrupted step left);
* :mod:`~bigembed.checkpoints.reading`: a trained model read back for inference, and the entity
  store that goes with it;
* :mod:`~bigembed.checkpoints.tables`: its embedding tables, one partition at a time, cached.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
