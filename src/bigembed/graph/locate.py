"""Slow, exact location of input rows: used only on the error path.

The fast path knows a bad row only by its index among the records pyarrow produced (which
skips empty lines, the header and, with --skip-bad-lines, rows of the wrong width). This
module re-reads the file line by line, enumerating records the same way, to turn that index
into the line number a user can open in an editor.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator

import pyarrow as pa

from bigembed.graph.inputs import InputFile


def _raw_lines(source: InputFile) -> Iterator[bytes]:
    """Physical lines of the (decompressed) file, without their line terminators."""
    with pa.input_stream(os.fspath(source.path), compression=source.compression) as stream:
        rest = b""
        while True:
            block = stream.read(1 << 20)
            if not block:
                break
            parts = (rest + block).split(b"\n")
            rest = parts.pop()
            for line in parts:
                yield line[:-1] if line.endswith(b"\r") else line
        if rest:
            yield rest[:-1] if rest.endswith(b"\r") else rest


def _records(source: InputFile) -> Iterator[tuple[int, int]]:
    """(first line number, number of fields) of every non-empty record, header included."""
    delimiter = source.text.parse_options(source.fmt).delimiter
    if source.fmt == "tsv":
        sep = delimiter.encode()
        for number, line in enumerate(_raw_lines(source), start=1):
            if line:
                yield number, line.count(sep) + 1
        return
    decoded = (line.decode("utf-8", "surrogateescape") + "\n" for line in _raw_lines(source))
    reader = csv.reader(decoded, delimiter=delimiter, quotechar='"', doublequote=True)
    start = 1
    for fields in reader:
        if fields:
            yield start, len(fields)
        start = reader.line_num + 1


def _data_records(source: InputFile) -> Iterator[tuple[int, int, int]]:
    """(line, fields, expected fields) of data records as pyarrow numbers them."""
    expected: int | None = None
    for line, width in _records(source):
        if expected is None:
            expected = width
            if source.text.header:
                continue
        yield line, width, expected


def first_wrong_width(source: InputFile) -> tuple[int, int, int] | None:
    """(line, fields, expected) of the first record whose width differs from the first's."""
    for line, width, expected in _data_records(source):
        if width != expected:
            return line, width, expected
    return None


def lines_of_rows(source: InputFile, rows: Iterable[int]) -> dict[int, int]:
    """Map data-row indices (0-based, as in record batches) to 1-based line numbers."""
    wanted = sorted(set(rows))
    out: dict[int, int] = {}
    if not wanted:
        return out
    if source.fmt == "parquet":
        return {r: r + 1 for r in wanted}
    skip_wide = source.bad_columns.skip
    index = 0
    pos = 0
    for line, width, expected in _data_records(source):
        if skip_wide and width != expected:
            continue
        if index == wanted[pos]:
            out[index] = line
            pos += 1
            if pos == len(wanted):
                break
        index += 1
    return out


def location(source: InputFile, row: int, line: int | None = None) -> str:
    """``FILE:LINE`` for text inputs, ``FILE: row N`` for Parquet (1-based)."""
    if source.fmt == "parquet":
        return f"{source.path}: row {row + 1}"
    if line is None:
        line = lines_of_rows(source, [row]).get(row)
    return f"{source.path}:{line}" if line is not None else f"{source.path}: data row {row + 1}"
