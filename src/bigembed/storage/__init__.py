"""On-disk graph stores: the entity store (counts, names) and bucketed edge stores."""

from bigembed.storage.edges import EdgeChunk, EdgeStore, check_edges_import, chunk_range
from bigembed.storage.entities import EntityStore

__all__ = ["EdgeChunk", "EdgeStore", "EntityStore", "check_edges_import", "chunk_range"]
