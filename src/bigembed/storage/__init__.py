"""On-disk graph stores: the entity store (counts, names) and bucketed edge stores.

This ``__init__`` is the package's public API: other packages import these names from
``bigembed.storage``, never from its modules. Readers: :class:`EntityStore`,
:class:`EdgeStore` (chunks of a bucket as :class:`EdgeChunk`), :func:`check_edges_import`,
:func:`check_edges_relations`, :func:`read_manifest`, :func:`has_manifest`. Writers (used by
``bigembed import``, the PBG converter and tests): :func:`write_entity_store`,
:func:`write_edge_manifest`, and the file names and dtypes of the format (see docs/FORMAT.md).
"""

from bigembed.storage.edges import (
    EdgeChunk,
    EdgeStore,
    check_edges_import,
    check_edges_relations,
    chunk_range,
    write_edge_manifest,
)
from bigembed.storage.entities import EntityStore, EntityTypeInfo, write_entity_store
from bigembed.storage.format import (
    DYNAMIC_REL_COUNT,
    DYNAMIC_REL_NAMES,
    EDGE_FORMAT,
    ENTITY_FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PUBLISHING_KEY,
    bucket_dir,
    entity_count_file,
    entity_names_file,
    has_manifest,
    index_dtype,
    read_manifest,
)

__all__ = [
    "DYNAMIC_REL_COUNT",
    "DYNAMIC_REL_NAMES",
    "EDGE_FORMAT",
    "ENTITY_FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PUBLISHING_KEY",
    "EdgeChunk",
    "EdgeStore",
    "EntityStore",
    "EntityTypeInfo",
    "bucket_dir",
    "check_edges_import",
    "check_edges_relations",
    "chunk_range",
    "entity_count_file",
    "entity_names_file",
    "has_manifest",
    "index_dtype",
    "read_manifest",
    "write_edge_manifest",
    "write_entity_store",
]
