"""Reading edge-list files (TSV/CSV/Parquet, optionally compressed): formats, columns, batches.

Used by the importer (``bigembed import``) and by evaluation of files of names (``bigembed
eval --edges FILE``); it knows nothing of entity stores or checkpoints.

This ``__init__`` is the package's public API; other packages import from here only.
Files of names read whole (evaluation): :class:`EdgeNameFile` with :class:`NameFileOptions`.
Streaming with bad-line handling (import): :class:`InputFile`, :func:`detect_format`, the
locators (:func:`location`, :func:`first_wrong_width`, :func:`lines_of_rows`,
:func:`header_suspicion`) and the vectorised checks of :mod:`~bigembed.edgelists.validate`.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
