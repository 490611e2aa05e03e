"""What training and evaluation share about buckets, below both (neither imports the other).

The key types (``PartitionKey``, ``Bucket``) live at the bottom, in :mod:`bigembed.partition_keys`.

* :mod:`~bigembed.buckets.geometry`: which partitions a bucket's relations use, how many edges
  each bucket has in a chunk;
* :mod:`~bigembed.buckets.batching`: cutting a bucket's edges into batches;
* :mod:`~bigembed.buckets.gather`: gathering a batch's embedding rows and its negatives;
* :mod:`~bigembed.buckets.negative_settings`: the negative counts a config asks for;
* :mod:`~bigembed.ranking.sampled`: scoring edges against sampled negatives, as the
  withheld-edge eval of training and the ``sampled`` protocol of ``bigembed eval`` both do;
* :mod:`~bigembed.ranking.metrics`: ranks from scores and the ranking metrics.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
