"""Input edge files: format detection, column selection, and streaming record batches.

Text files (TSV/CSV, optionally gzip/bz2/zstd-compressed) are parsed with pyarrow's
streaming CSV reader and Parquet files are read batch by batch, so memory does not depend on
the file size. Every column is read as a string here (weights too): turning values into
numbers and ids happens vectorised later, where bad values can be pinpointed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from bigembed.edgelists.arrow_files import ArrowObjects
from bigembed.edgelists.hints import (
    check_delimiter,
    check_parquet_types,
    column_hint,
    delimiter_hint,
    first_line,
    shown_names,
)
from bigembed.edgelists.throttle import ReadAheadLimit
from bigembed.errors import InputError

TEXT_FORMATS = ("tsv", "csv")
FORMATS = (*TEXT_FORMATS, "parquet")
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_EXTENSIONS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
ROLES = ("lhs", "rel", "rhs", "weight")
READ_AHEAD_BLOCKS = 3


def detect_format(path: Path, forced: str | None) -> tuple[str, str | None]:
    """(format, compression codec or None) of ``path``, from ``forced`` or the extension."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = None
    if suffixes and suffixes[-1] in COMPRESSIONS:
        compression = COMPRESSIONS[suffixes.pop()]
    if forced is not None:
        return forced, compression
    fmt = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the format from the file name; name it .tsv/.txt/.csv/.parquet "
            f"(optionally .gz/.bz2/.zst) or pass --format tsv|csv|parquet"
        )
    if fmt == "parquet" and compression is not None:
        raise InputError(f"{path}: a Parquet file is compressed inside; do not compress it again")
    return fmt, compression


@dataclass(frozen=True)
class ColumnSpec:
    """Which input column plays which role: an index (int) or a header name (str)."""

    lhs: int | str = 0
    rel: int | str | None = 1
    rhs: int | str = 2
    weight: int | str | None = None

    def roles(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for role in ROLES:
            value = getattr(self, role)
            if value is not None:
                out[role] = value
        return out


@dataclass(frozen=True)
class TextOptions:
    header: bool = False
    delimiter: str | None = None  # None: tab for tsv, comma for csv
    block_size: int = 8 << 20  # the CSV reader reads up to 32 blocks ahead

    def __post_init__(self) -> None:
        if self.delimiter is not None:
            object.__setattr__(self, "delimiter", check_delimiter(self.delimiter))

    def parse_options(self, fmt: str) -> pacsv.ParseOptions:
        quoted = fmt == "csv"
        return pacsv.ParseOptions(
            delimiter=self.delimiter or ("," if quoted else "\t"),
            quote_char='"' if quoted else False,
            double_quote=quoted,
            escape_char=False,
        )


@dataclass
class Batch:
    """Columns of one record batch by role, with the 0-based data row index of its first row."""

    columns: dict[str, pa.Array]
    first_row: int
    position: int  # bytes (text) or rows (parquet) of the input consumed so far
    text_bytes: int = 0  # uncompressed text: at most the bytes of these rows in the file

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values())))


@dataclass
class BadColumnRows:
    """Rows pyarrow's parser rejected for their column count (filled by its row handler)."""

    skip: bool
    count: int = 0
    first_text: str | None = None
    first_actual: int | None = None
    expected: int | None = None
    examples: list[str] = field(default_factory=list)

    def handler(self, row: pacsv.InvalidRow) -> str:
        self.count += 1
        if self.first_text is None:
            self.first_text = row.text
            self.first_actual = row.actual_columns
            self.expected = row.expected_columns
        return "skip" if self.skip else "error"


def _data_size(column: pa.Array) -> int:
    """Bytes of string data in ``column`` (offsets span), 0 for other types."""
    if not (pa.types.is_string(column.type) and len(column)):
        return 0
    offsets = column.buffers()[1]
    first, last = column.offset, column.offset + len(column)
    view = memoryview(offsets).cast("i")
    return int(view[last] - view[first])


def _skip(row: pacsv.InvalidRow) -> str:
    return "skip"


class InputFile:
    """One edge input file, opened lazily; iterate :meth:`batches` to stream it."""

    def __init__(
        self,
        path: Path,
        fmt: str,
        compression: str | None,
        columns: ColumnSpec,
        text: TextOptions,
        *,
        skip_bad_lines: bool,
    ) -> None:
        self.path = path
        self.fmt = fmt
        self.compression = compression
        self.spec = columns
        self.text = text
        self.bad_columns = BadColumnRows(skip=skip_bad_lines)
        if not path.exists():
            raise InputError(f"{path}: input file not found")
        if not path.is_file():
            raise InputError(f"{path}: not a regular file")
        self.size = path.stat().st_size
        if self.size == 0:
            raise InputError(f"{path}: empty input file (no edges)")
        self.column_names: list[str] = []
        self.selected: dict[str, str] = {}  # role -> column name in the file
        self._resolve_columns()

    # ---- opening
    def _open_stream(self) -> tuple[BinaryIO, Any]:
        """(raw file, decompressed stream); ``raw.tell()`` is the progress in file bytes."""
        raw = open(self.path, "rb")  # noqa: SIM115 (closed by the caller)
        if self.compression is None:
            return raw, raw
        return raw, pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), self.compression)

    def _text_reader(
        self, include: list[str] | None, block_size: int, limit: ReadAheadLimit | None = None
    ) -> tuple[BinaryIO, pacsv.CSVStreamingReader, ArrowObjects]:
        """(raw file, reader, what to wait for after dropping the reader: see ``arrow_files``)."""
        raw, stream = self._open_stream()
        if limit is not None:
            limit.attach(stream)
            stream = limit
        read = pacsv.ReadOptions(
            block_size=block_size,
            use_threads=False,  # row numbers in parse errors need the serial reader
            autogenerate_column_names=not self.text.header,
        )
        convert = pacsv.ConvertOptions(
            check_utf8=False,  # validated vectorised later, to name the bad line
            column_types={name: pa.string() for name in include or []},
            include_columns=include or [],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )
        parse = self.text.parse_options(self.fmt)
        # The probe for the column names (include None) only needs the first row.
        handed = ArrowObjects()  # Arrow alone may hold what it gets, so we know when it lets go
        parse.invalid_row_handler = handed.callback(
            self.bad_columns.handler if include is not None else _skip
        )
        try:
            reader = pacsv.open_csv(
                pa.PythonFile(handed.file(stream), mode="r"),
                read_options=read,
                parse_options=parse,
                convert_options=convert,
            )
        except pa.ArrowInvalid as exc:
            del parse  # holds the row handler
            self._drop(handed, raw)
            if self.bad_columns.first_text is not None and not self.bad_columns.skip:
                raise BadColumnCount(self) from None
            if "Empty CSV file" in str(exc):
                raise InputError(f"{self.path}: empty input file (no edges)") from None
            raise self._arrow_error(exc) from None
        except (OSError, pa.ArrowException) as exc:
            del parse
            self._drop(handed, raw)
            raise self._arrow_error(exc) from None
        return raw, reader, handed

    def _drop(self, handed: ArrowObjects, raw: BinaryIO) -> None:
        """After the reader is gone: close the input, wait until Arrow lets go of it, and raise
        a read error Arrow was not told about (it saw the end of the input instead)."""
        handed.stop()
        raw.close()
        handed.wait_released()
        if handed.error is not None:
            raise self._arrow_error(handed.error) from None

    def _arrow_error(self, exc: BaseException) -> InputError:
        what = f"{self.compression} " if self.compression else ""
        return InputError(f"{self.path}: cannot read this {what}{self.fmt} file: {exc}")

    def _resolve_columns(self) -> None:
        schema: pa.Schema | None = None
        if self.fmt == "parquet":
            try:
                schema = pq.ParquetFile(self.path).schema_arrow
            except (OSError, pa.ArrowException) as exc:
                raise self._arrow_error(exc) from None
            self.column_names = list(schema.names)
        else:
            raw, reader, handed = self._text_reader(None, 1 << 20)
            try:
                self.column_names = list(reader.schema.names)
            finally:
                del reader
                self._drop(handed, raw)
        first_line = 2 if self.text.header and self.fmt != "parquet" else 1
        for role, col in self.spec.roles().items():
            flag = f"--{role}-col"
            if isinstance(col, int):
                if not 0 <= col < len(self.column_names):
                    where = f"{self.path}:{first_line}" if self.fmt != "parquet" else f"{self.path}"
                    indices = [c for c in self.spec.roles().values() if isinstance(c, int)]
                    hint = self._delimiter_hint(width=max(indices) + 1)
                    raise InputError(
                        f"{where}: has {len(self.column_names)} column(s) but {flag} is {col} "
                        f"(columns count from 0){hint}"
                    )
                self.selected[role] = self.column_names[col]
            else:
                if self.fmt != "parquet" and not self.text.header:
                    raise InputError(
                        f"{self.path}: {flag} {col!r} names a column, which needs --header "
                        f"(a first line with column names) or a column index"
                    )
                if col not in self.column_names:
                    names = [c for c in self.spec.roles().values() if isinstance(c, str)]
                    hint = self._delimiter_hint(names=names) or column_hint(
                        col, self.column_names, flag
                    )
                    raise InputError(
                        f"{self.path}: no column {col!r} for {flag} (columns: "
                        f"{shown_names(self.column_names)}){hint}"
                    )
                self.selected[role] = col
        if schema is not None:
            check_parquet_types(self.path, schema, self.selected)
        seen: dict[str, str] = {}
        for role, name in self.selected.items():
            if name in seen:
                raise InputError(
                    f"{self.path}: --{role}-col and --{seen[name]}-col both select column {name!r}"
                )
            seen[name] = role

    def _delimiter_hint(self, *, names: list[str] | None = None, width: int = 0) -> str:
        """A ``--delimiter`` suggestion for a text input whose first line splits better at
        another separator (see :func:`~bigembed.edgelists.hints.delimiter_hint`)."""
        if self.fmt == "parquet":
            return ""
        current = self.text.parse_options(self.fmt).delimiter
        line = first_line(self.path, self.compression)
        return delimiter_hint(line, current, names=names or (), width=width)

    # ---- reading
    def batches(self) -> Iterator[Batch]:
        if self.fmt == "parquet":
            yield from self._parquet_batches()
        else:
            yield from self._text_batches()

    def _text_batches(self) -> Iterator[Batch]:
        names = list(self.selected.values())
        block = self.text.block_size
        limit = ReadAheadLimit(READ_AHEAD_BLOCKS * block)
        raw, reader, handed = self._text_reader(names, block, limit)
        by_name = {name: role for role, name in self.selected.items()}
        row = 0
        try:
            while True:
                try:
                    record = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as exc:
                    if self.bad_columns.first_text is not None and not self.bad_columns.skip:
                        raise BadColumnCount(self) from None
                    raise self._arrow_error(exc) from None
                except (OSError, pa.ArrowException) as exc:
                    raise self._arrow_error(exc) from None
                if record.num_rows == 0:
                    limit.advance(block)
                    continue
                cols = {by_name[n]: record.column(n) for n in record.schema.names}
                text_bytes = 0
                if self.compression is None:  # one separator or newline per field
                    text_bytes = record.num_rows * len(self.column_names)
                    text_bytes += sum(_data_size(c) for c in cols.values())
                yield Batch(cols, row, raw.tell(), text_bytes)
                row += record.num_rows
                limit.advance(block)  # about one block of input per batch
        finally:
            limit.stop()
            del reader
            self._drop(handed, raw)

    def _parquet_batches(self) -> Iterator[Batch]:
        try:
            pf = pq.ParquetFile(self.path)
            by_name = {name: role for role, name in self.selected.items()}
            row = 0
            for record in pf.iter_batches(batch_size=1 << 20, columns=list(by_name)):
                if record.num_rows == 0:
                    continue
                cols = {by_name[n]: record.column(n) for n in record.schema.names}
                row += record.num_rows
                yield Batch(cols, row - record.num_rows, row)
        except (OSError, pa.ArrowException) as exc:
            raise self._arrow_error(exc) from None

    def estimate_rows(self, rows: int, text_bytes: int, position: int) -> int:
        """Rows in the whole input, from what was read so far (for sizing the spill runs).

        Errs on the high side for uncompressed text (bytes of unused columns are not seen);
        for compressed text the reader's read-ahead makes the guess low, hence the factor.
        """
        if self.fmt == "parquet":
            return self.total_for_progress()
        if self.compression is None and text_bytes > 0:
            return math.ceil(self.size * rows / text_bytes)
        return math.ceil(2 * self.size * rows / max(position, 1))

    def total_for_progress(self) -> int:
        """Bytes of the file (text) or rows (Parquet): the unit of :attr:`Batch.position`."""
        if self.fmt == "parquet":
            return int(pq.ParquetFile(self.path).metadata.num_rows)
        return self.size


class BadColumnCount(Exception):
    """Raised inside the reader when a row has the wrong column count (located by the caller)."""

    def __init__(self, source: InputFile) -> None:
        super().__init__(source.path)
        self.source = source
