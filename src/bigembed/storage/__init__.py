"""On-disk graph stores: the entity store (counts, names) and bucketed edge stores.

This ``__init__`` is the package's public API: other packages import these names from
``bigembed.storage``, never from its modules. Readers: :class:`EntityStore`,
:class:`EdgeStore` (chunks of a bucket as :class:`EdgeChunk`), :func:`check_edges_import`,
:func:`check_edges_relations`, :func:`read_manifest`, :func:`has_manifest`. Writers (used by
``bigembed import``, the PBG converter and tests): :func:`write_entity_store`,
:func:`write_edge_manifest`, and the file names and dtypes of the format (see docs/FORMAT.md).
Import identity: :func:`content_import_id`, :func:`is_legacy_import_id`; the checkpoints
trained on a store: :func:`record_dependent`, :func:`read_dependents`.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
