"""Reading edge-list files (TSV/CSV/Parquet, optionally compressed): formats, columns, batches.

Used by the importer (``bigembed import``) and by evaluation of files of names (``bigembed
eval --edges FILE``); it knows nothing of entity stores or checkpoints.

This ``__init__`` is the package's public API; other packages import from here only.
Files of names read whole (evaluation): :class:`EdgeNameFile` with :class:`NameFileOptions`.
Streaming with bad-line handling (import): :class:`InputFile`, :func:`detect_format`, the
locators (:func:`location`, :func:`first_wrong_width`, :func:`lines_of_rows`,
:func:`header_suspicion`) and the vectorised checks of :mod:`~bigembed.edgelists.validate`.
"""

from bigembed.edgelists.inputs import (
    FORMATS,
    BadColumnCount,
    Batch,
    ColumnSpec,
    InputFile,
    TextOptions,
    detect_format,
)
from bigembed.edgelists.locate import first_wrong_width, header_suspicion, lines_of_rows, location
from bigembed.edgelists.names import EdgeNameFile, NameBatch, NameFileOptions
from bigembed.edgelists.splitting import PARTS, SplitOptions, SplitSummary, split_edges
from bigembed.edgelists.validate import (
    BAD_UTF8,
    EMPTY_NAME,
    EMPTY_RELATION,
    NUL_BYTE,
    UNKNOWN_RELATION,
    WRONG_WIDTH,
    Problem,
    as_strings,
    check_names,
    check_weights,
    combine,
    first_problem,
    has_nul,
)

__all__ = [
    "BAD_UTF8",
    "EMPTY_NAME",
    "EMPTY_RELATION",
    "FORMATS",
    "NUL_BYTE",
    "PARTS",
    "UNKNOWN_RELATION",
    "WRONG_WIDTH",
    "BadColumnCount",
    "Batch",
    "ColumnSpec",
    "EdgeNameFile",
    "InputFile",
    "NameBatch",
    "NameFileOptions",
    "Problem",
    "SplitOptions",
    "SplitSummary",
    "TextOptions",
    "as_strings",
    "check_names",
    "check_weights",
    "combine",
    "detect_format",
    "first_problem",
    "first_wrong_width",
    "has_nul",
    "header_suspicion",
    "lines_of_rows",
    "location",
    "split_edges",
]
