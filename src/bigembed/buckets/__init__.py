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

from bigembed.buckets.batching import Batch, batch_plan, make_batches, planned_batch
from bigembed.buckets.gather import draw_uniform, gather_drawn, gather_rows, gather_side
from bigembed.buckets.geometry import bucket_sides, chunk_sizes, partitions_per_side
from bigembed.buckets.negative_settings import negative_settings

__all__ = [
    "Batch",
    "batch_plan",
    "bucket_sides",
    "chunk_sizes",
    "draw_uniform",
    "gather_drawn",
    "gather_rows",
    "gather_side",
    "make_batches",
    "negative_settings",
    "partitions_per_side",
    "planned_batch",
]
