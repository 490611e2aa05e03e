from .batching import Batch, batch_plan, make_batches, planned_batch
from .gather import draw_uniform, gather_drawn, gather_rows, gather_side
from .geometry import bucket_sides, chunk_sizes, partitions_per_side
from .negative_settings import negative_settings

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
