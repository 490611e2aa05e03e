"""Reading a file of edges given by name (``lhs rel rhs`` columns) as string batches.

The reader for callers that map names to ids themselves (evaluation of ``--edges FILE``):
it picks the columns of a :class:`ColumnSpec`, reads every row (no skipping of bad lines),
turns every column into strings and turns a row of the wrong width into an
:class:`~bigembed.errors.InputError` naming the file and line. ``where(row)`` names the
``FILE:LINE`` of a data row, for the caller's own errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from bigembed.edgelists.inputs import (
    BadColumnCount,
    ColumnSpec,
    InputFile,
    TextOptions,
    detect_format,
)
from bigembed.edgelists.locate import first_wrong_width, location
from bigembed.edgelists.validate import as_strings
from bigembed.errors import InputError


@dataclass(frozen=True)
class NameFileOptions:
    """How a file of names is read: its columns, text options and format (None: from the name)."""

    columns: ColumnSpec = field(default_factory=ColumnSpec)
    text: TextOptions = field(default_factory=TextOptions)
    format: str | None = None


@dataclass
class NameBatch:
    """String columns of one batch by role (``lhs``, ``rhs``, ``rel`` if read, ``weight``)."""

    columns: dict[str, pa.Array]
    first_row: int  # 0-based data row index of the batch's first row

    @property
    def num_rows(self) -> int:
        return len(self.columns["lhs"])


class EdgeNameFile:
    """One file of edges by name; iterate :meth:`batches`, locate rows with :meth:`where`."""

    def __init__(self, path: Path, options: NameFileOptions | None = None) -> None:
        """Checks the format (from the name or ``options.format``); the file is opened (and its
        columns checked) by the first :meth:`batches`."""
        self.path = path
        self.options = options or NameFileOptions()
        self._format = detect_format(path, self.options.format)
        self._opened: InputFile | None = None

    @property
    def _source(self) -> InputFile:
        if self._opened is None:
            fmt, compression = self._format
            opts = self.options
            self._opened = InputFile(
                self.path, fmt, compression, opts.columns, opts.text, skip_bad_lines=False
            )
        return self._opened

    def batches(self) -> Iterator[NameBatch]:
        source = self._source
        try:
            for batch in source.batches():
                cols = {role: as_strings(col) for role, col in batch.columns.items()}
                yield NameBatch(cols, batch.first_row)
        except BadColumnCount:
            found = first_wrong_width(source)
            if found is None:
                raise InputError(f"{self.path}: a line has the wrong number of columns") from None
            line, width, expected = found
            raise InputError(
                f"{self.path}:{line}: has {width} column(s), the first line has {expected}"
            ) from None

    def where(self, row: int) -> str:
        """``FILE:LINE`` of data row ``row`` (0-based; slow: re-reads the file up to it)."""
        return location(self._source, row)
