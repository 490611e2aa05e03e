"""On-disk graph data: entity dictionaries and partitions, bucketed edges, the importer."""

from bigembed.graph.edges import EdgeChunk, EdgeStore, chunk_range
from bigembed.graph.entities import EntityStore

__all__ = ["EdgeChunk", "EdgeStore", "EntityStore", "chunk_range"]
