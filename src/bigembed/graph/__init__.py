"""On-disk graph data: entity dictionaries and partitions, bucketed edges, the importer."""

from bigembed.graph.edges import EdgeChunk, EdgeStore, check_edges_import, chunk_range
from bigembed.graph.entities import EntityStore

__all__ = ["EdgeChunk", "EdgeStore", "EntityStore", "check_edges_import", "chunk_range"]
