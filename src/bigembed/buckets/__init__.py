"""A bucket's edges as batches: geometry, batch plans, row gathering (shared by train and eval).

Training, its withheld-edge eval and the ``sampled`` protocol of ``bigembed eval`` cut a
bucket's edges and gather its rows the same way; this package is that one way, below
``kernels``, ``ranking``, ``train`` and ``eval``. The key types (``PartitionKey``, ``Bucket``)
live at the bottom, in :mod:`bigembed.partition_keys`; ranking against sampled negatives and the
ranking metrics are in :mod:`bigembed.ranking`.

* :mod:`~bigembed.buckets.geometry`: which partitions a bucket's relations use, how many edges
  each bucket has in a chunk;
* :mod:`~bigembed.buckets.batching`: cutting a bucket's edges into batches (batch plans);
* :mod:`~bigembed.buckets.gather`: gathering a batch's embedding rows and its negatives;
* :mod:`~bigembed.buckets.negative_settings`: the negative counts a config asks for.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
