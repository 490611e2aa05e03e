"""Bucket geometry: which partitions a bucket's relations use, and its edges per chunk.

The key types themselves are in :mod:`bigembed.partition_keys`. A relation whose lhs (rhs) type
is unpartitioned uses that type's partition 0 in every bucket; with dynamic relations every
relation shares the first relation's types.
"""

from __future__ import annotations

from typing import Literal

from bigembed.config import ConfigSchema
from bigembed.partition_keys import Bucket, BucketSides
from bigembed.storage import EdgeStore, chunk_range


def partitions_per_side(cfg: ConfigSchema, side: Literal["lhs", "rhs"]) -> int:
    """Buckets along one side: the most partitions of any type on that side of a relation."""
    types = {getattr(r, side) for r in cfg.relations}
    return max(cfg.entities[t].num_partitions for t in types)


def bucket_sides(cfg: ConfigSchema, bucket: Bucket) -> BucketSides:
    """Per relation index: the (lhs, rhs) partition keys ``bucket`` uses."""
    i, j = bucket
    rels = cfg.relations[:1] if cfg.dynamic_relations else cfg.relations
    return [
        (
            (r.lhs, i if cfg.entities[r.lhs].num_partitions > 1 else 0),
            (r.rhs, j if cfg.entities[r.rhs].num_partitions > 1 else 0),
        )
        for r in rels
    ]


def chunk_sizes(edges: EdgeStore, chunk: int, num_chunks: int) -> dict[Bucket, int]:
    """Edges of each non-empty bucket in chunk ``chunk`` of ``num_chunks`` (may be 0 in a chunk).

    The rows of a chunk are :func:`~bigembed.storage.edges.chunk_range`'s (the on-disk rule).
    """
    sizes = {}
    for bucket in edges.buckets():
        n = edges.num_edges(*bucket)
        if n > 0:
            start, end = chunk_range(n, chunk, num_chunks)
            sizes[bucket] = end - start
    return sizes
