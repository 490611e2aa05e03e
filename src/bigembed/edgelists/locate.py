"""Slow, exact location of input rows (used only on the error path), and a look at the first
lines of a text input (does its first line look like a header?).

The fast path knows a bad row only by its index among the records pyarrow produced (which
skips empty lines, the header and, with --skip-bad-lines, rows of the wrong width). This
module re-reads the file line by line, enumerating records the same way, to turn that index
into the line number a user can open in an editor.
"""

from __future__ import annotations

import csv
import itertools
import os
from collections.abc import Iterable, Iterator

import pyarrow as pa

from bigembed.edgelists.inputs import InputFile


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


# Column names people give edge lists; two of them in the first line suggest a header.
HEADER_WORDS = frozenset(
    [
        "lhs",
        "rel",
        "rhs",
        "weight",
        "head",
        "relation",
        "tail",
        "source",
        "target",
        "src",
        "dst",
        "subject",
        "predicate",
        "object",
        "from",
        "to",
        "node1",
        "node2",
        "label",
    ]
)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_rows(source: InputFile, count: int) -> list[list[str]]:
    lines = (line.decode("utf-8", "replace") for line in _raw_lines(source) if line)
    head = list(itertools.islice(lines, count))
    delimiter = source.text.parse_options(source.fmt).delimiter
    if source.fmt == "tsv":
        return [line.split(delimiter) for line in head]
    return [row for row in csv.reader(head, delimiter=delimiter) if row]


def header_suspicion(source: InputFile, sample: int = 100) -> str | None:
    """Why the first line of a text input read without --header looks like column names.

    None when it does not (or for Parquet, or with --header): a first line whose selected
    fields are column words (``lhs``, ``rel``, ``rhs``, ...), or whose lhs/rhs/weight field is
    not a number while the same field of every following sampled line is.
    """
    if source.fmt == "parquet" or source.text.header:
        return None
    try:
        rows = _first_rows(source, sample)
    except (OSError, ValueError, csv.Error):
        return None  # the reader reports unreadable input
    if not rows:
        return None
    first, rest = rows[0], rows[1:]
    fields = {
        role: first[col].strip()
        for role, col in source.spec.roles().items()
        if isinstance(col, int) and 0 <= col < len(first)
    }
    words = [f for f in fields.values() if f.lower() in HEADER_WORDS]
    if len(words) >= min(2, len(fields)) and words:
        return f"its fields {', '.join(repr(w) for w in words)} look like column names"
    for role in ("lhs", "rhs", "weight"):
        col = source.spec.roles().get(role)
        if not isinstance(col, int) or role not in fields or _is_number(fields[role]):
            continue
        others = [row[col].strip() for row in rest if 0 <= col < len(row)]
        if others and all(_is_number(v) for v in others):
            return (
                f"its {role} field {fields[role]!r} is not a number but that field of the "
                f"next {len(others)} line(s) is"
            )
    return None
