"""The identity types of the partitioned data: partition keys, buckets, a bucket's sides.

A *partition key* ``(entity type, partition)`` names one table of embeddings. A *bucket*
``(i, j)`` holds the edges whose lhs lies in partition ``i`` and rhs in partition ``j`` of their
types. This module imports nothing, so every layer can use it (it sits at the bottom, with
``errors``), and Hogwild workers, the servers and the partition store use these types without
pulling in the config or the stores (and with them pyarrow, a large import in every worker
process).
"""

from __future__ import annotations

from typing import TypeAlias

PartitionKey: TypeAlias = tuple[str, int]
"""(entity type, partition index)."""

Bucket: TypeAlias = tuple[int, int]
"""(lhs partition, rhs partition)."""

BucketSides: TypeAlias = list[tuple[PartitionKey, PartitionKey]]
"""Per relation index: the (lhs, rhs) partition keys a bucket uses."""
