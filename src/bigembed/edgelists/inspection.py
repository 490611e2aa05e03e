"""What an edge file looks like, read from the file itself (for ``bigembed init``).

Text files: the field separator (the one that splits every sampled line into the same number
of fields, the format's own first), whether the first line names the columns, and the column
names or count. Parquet: the schema's column names. Then which columns hold the head, the
relation and the tail (the flags given, else well-known header names, else the positions
0, 1, 2, or 0 and 1 for two columns), and one full pass over those columns with the import's
own reader: the number of edges and the distinct relations with their edge counts, up to a
limit (past it only "more than the limit" is known, which is all a config needs).

Every decision is recorded with the evidence for it, so the caller can say what it saw.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bigembed.edgelists.inputs import BadColumnCount, ColumnSpec, InputFile, TextOptions
from bigembed.edgelists.locate import HEADER_WORDS, first_wrong_width
from bigembed.edgelists.validate import as_strings
from bigembed.errors import InputError

SAMPLE_BYTES = 1 << 16
SAMPLE_LINES = 200
DELIMITERS = ("\t", ",", ";", "|", " ")
DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}

# Header names that say which role a column plays (lowercase, compared without - and _).
ROLE_NAMES = {
    "lhs": ("lhs", "head", "h", "source", "src", "subject", "sub", "s", "from", "node1", "start"),
    "rel": ("rel", "relation", "r", "predicate", "pred", "p", "label", "type", "edgetype"),
    "rhs": ("rhs", "tail", "t", "target", "dst", "object", "obj", "o", "to", "node2", "end"),
}
# Names that, alone in a first line, mark it as a header (one-letter ones could be entities).
_HEADER_EVIDENCE = HEADER_WORDS | {n for v in ROLE_NAMES.values() for n in v if len(n) > 2}


@dataclass
class EdgeFileShape:
    """What :func:`inspect_edge_file` found; ``why`` says how each guess was made."""

    path: Path
    fmt: str
    compression: str | None
    delimiter: str | None  # text files: the separator (None for Parquet)
    header: bool
    column_names: list[str]  # header or Parquet names; pyarrow's f0, f1... without a header
    columns: ColumnSpec
    edges: int = 0
    relation_counts: dict[str, int] = field(default_factory=dict)  # most edges first
    relation_limit: int = 20  # the most distinct relations counted
    more_relations: bool = False  # more distinct relations than the limit: counts incomplete
    why: dict[str, str] = field(default_factory=dict)

    def column_label(self, role: str) -> str | None:
        """The selected column of ``role`` as the user sees it: its name, else its index."""
        col = getattr(self.columns, role)
        return None if col is None else str(col)


def delimiter_name(delimiter: str) -> str:
    return DELIMITER_NAMES.get(delimiter, repr(delimiter))


# ---------------------------------------------------------------------- text sample


def _sample_lines(path: Path, compression: str | None) -> list[str]:
    """The first complete non-empty lines of a (decompressed) text file."""
    try:
        with pa.input_stream(os.fspath(path), compression=compression) as stream:
            data = stream.read(SAMPLE_BYTES)
            complete = len(data) < SAMPLE_BYTES or stream.read(1) == b""
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot read this file: {exc}") from None
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")  # Arrow skips a BOM too
    lines = text.splitlines()
    if not complete and len(lines) > 1:
        lines.pop()  # cut in the middle
    return [line for line in lines if line.strip()][:SAMPLE_LINES]


def _split(lines: list[str], delimiter: str, fmt: str) -> list[list[str]]:
    if fmt == "csv":
        return [row for row in csv.reader(lines, delimiter=delimiter) if row]
    return [line.split(delimiter) for line in lines]


def _choose_delimiter(lines: list[str], fmt: str, path: Path) -> tuple[str, str]:
    """(separator, why): the first candidate (the format's own first) that splits nearly every
    sampled line (a bad line is the reader's to report, with its number) into one width >= 2."""
    default = "," if fmt == "csv" else "\t"
    candidates = (default, *(d for d in DELIMITERS if d != default))
    for delimiter in candidates:
        widths = Counter(len(row) for row in _split(lines, delimiter, fmt))
        width, count = widths.most_common(1)[0]
        if width >= 2 and count >= 0.9 * len(lines):
            name = delimiter_name(delimiter)
            if delimiter == default:
                return delimiter, f"{name}-separated, as the {fmt} format says"
            return delimiter, f"{name}-separated (the sampled lines have {width - 1} {name}s)"
    tried = ", ".join(delimiter_name(d) for d in candidates)
    raise InputError(
        f"{path}: cannot tell the field separator: none of {tried} splits the first "
        f"{len(lines)} line(s) into the same number (2 or more) of fields; pass --delimiter"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _header_evidence(rows: list[list[str]]) -> str | None:
    """Why the first row looks like column names, or None.

    A field that is a usual column name (``source``, ``relation``, ``tail``...) and occurs in
    no other sampled line of its column, or a field that is not a number in a column of
    numbers.
    """
    first, rest = rows[0], rows[1:]
    for i, value in enumerate(first):
        others = [row[i] for row in rest if i < len(row)]
        if _norm(value) in _HEADER_EVIDENCE and value not in others:
            return f"{value.strip()!r} is a column name (and in no other line)"
        if others and not _is_number(value) and all(_is_number(v) for v in others):
            return f"{value!r} is not a number but the rest of column {i} is"
    return None


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "").replace("-", "").replace(" ", "")


# ---------------------------------------------------------------------- columns


def _by_name(names: list[str], role: str, taken: set[int]) -> int | None:
    wanted = ROLE_NAMES[role]
    for i, name in enumerate(names):
        if i not in taken and _norm(name) in wanted:
            return i
    return None


def _auto_columns(names: list[str] | None, width: int) -> tuple[dict[str, int | None], str]:
    """Column indices of lhs, rel, rhs: by well-known header names, else by position."""
    if names is not None:
        found: dict[str, int | None] = {}
        taken: set[int] = set()
        for role in ("lhs", "rhs", "rel"):
            col = found[role] = _by_name(names, role, taken)
            if col is not None:
                taken.add(col)
        if found["lhs"] is not None and found["rhs"] is not None:
            return found, "by their names"
    if width == 2:
        return {"lhs": 0, "rel": None, "rhs": 1}, "two columns: head, tail (no relation column)"
    return {"lhs": 0, "rel": 1, "rhs": 2}, "by position: head, relation, tail"


def _resolve(
    given: dict[str, int | str | None], names: list[str] | None, width: int, path: Path
) -> tuple[ColumnSpec, str]:
    """The columns to read: ``given`` (role -> index, name, or None for no relation column)
    where given, the guesses elsewhere."""
    chosen, why = _auto_columns(names, width)
    for role, col in given.items():
        if col is None:
            chosen[role] = None
            continue
        if isinstance(col, str):
            if names is None or col not in names:
                known = f"columns: {', '.join(names)}" if names else "the file has no header"
                raise InputError(f"{path}: no column {col!r} for --{role}-col ({known})")
            col = names.index(col)
        if not 0 <= col < width:
            raise InputError(
                f"{path}: has {width} column(s) but --{role}-col is {col} (columns count from 0)"
            )
        chosen[role] = col
    if given:
        flags = ", ".join(f"--{r}-col" for r in given)
        why = f"{flags} as given, the rest {why}" if len(given) < 3 else f"{flags} as given"
    lhs, rel, rhs = chosen["lhs"], chosen["rel"], chosen["rhs"]
    picked = [c for c in (lhs, rel, rhs) if c is not None]
    if lhs is None or rhs is None or len(set(picked)) != len(picked):
        raise InputError(
            f"{path}: the head, relation and tail must be different columns (lhs {lhs}, rel "
            f"{rel}, rhs {rhs}); choose them with --lhs-col, --rel-col, --rhs-col"
        )
    return ColumnSpec(lhs=lhs, rel=rel, rhs=rhs), why


# ---------------------------------------------------------------------- the whole file


def _label(names: list[str], col: Any) -> Any:
    """The column's name where it names one column unambiguously, else its index."""
    if not isinstance(col, int):
        return col
    name = names[col]
    return name if name.strip() and names.count(name) == 1 else col


def _text_layout(
    path: Path,
    fmt: str,
    compression: str | None,
    delimiter: str | None,
    header: bool | None,
    given: dict[str, int | str | None],
) -> tuple[str, bool, list[str] | None, int, dict[str, str]]:
    """(separator, header, column names or None, width, why) of a text file."""
    why: dict[str, str] = {}
    lines = _sample_lines(path, compression)
    if not lines:
        raise InputError(f"{path}: empty input file (no edges)")
    if delimiter is None:
        delimiter, why["delimiter"] = _choose_delimiter(lines, fmt, path)
    else:
        if len(delimiter) != 1:
            raise InputError(f"--delimiter {delimiter!r}: give one character (e.g. ';' or '\\t')")
        why["delimiter"] = f"{delimiter_name(delimiter)}-separated (--delimiter)"
    rows = _split(lines, delimiter, fmt)
    width = Counter(len(row) for row in rows).most_common(1)[0][0]
    if width < 2:
        raise InputError(
            f"{path}:1: one field when split at {delimiter_name(delimiter)}s; an edge needs a "
            f"head and a tail column (is --delimiter right?)"
        )
    if header is None:
        evidence = _header_evidence(rows)
        header = evidence is not None
        why["header"] = (
            f"the first line names the columns: {evidence}"
            if evidence
            else "no header line (the first line looks like an edge; --header if it is not)"
        )
    else:
        why["header"] = "header line (--header)" if header else "no header line (--no-header)"
    names = rows[0] if header else None  # as Arrow reads them, spaces included
    return delimiter, header, names, width, why


def _parquet_names(path: Path) -> list[str]:
    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot read this parquet file: {exc}") from None


def _check_parquet_types(path: Path, spec: ColumnSpec) -> None:
    schema = pq.ParquetFile(path).schema_arrow
    for role, col in spec.roles().items():
        fld = schema.field(col)
        if pa.types.is_nested(fld.type):
            raise InputError(
                f"{path}: column {fld.name!r} ({fld.type}) holds lists or records, not names; "
                f"choose a column of names with --{role}-col"
            )


def _scan(source: InputFile, shape: EdgeFileShape) -> None:
    """Count the edges and the edges of each distinct relation (up to the shape's limit)."""
    counts: Counter[str] = Counter()
    try:
        for batch in source.batches():
            shape.edges += batch.num_rows
            if "rel" not in batch.columns or shape.more_relations:
                continue
            tally = pc.value_counts(as_strings(batch.columns["rel"]))
            for value, count in zip(
                tally.field("values").to_pylist(), tally.field("counts").to_pylist(), strict=True
            ):
                if value:  # an empty relation is the import's to report, with its line
                    counts[value] += count
            if len(counts) > shape.relation_limit:
                shape.more_relations = True
    except BadColumnCount:
        found = first_wrong_width(source)
        if found is None:
            raise InputError(f"{source.path}: a line has another number of fields") from None
        line, width, expected = found
        raise InputError(
            f"{source.path}:{line}: {width} field(s) where the first line has {expected} "
            f"(is the separator {delimiter_name(shape.delimiter or ',')}?)"
        ) from None
    if shape.edges == 0:
        raise InputError(f"{source.path}: no edges (only a header line?)")
    shape.relation_counts = dict(counts.most_common())


def inspect_edge_file(
    path: Path,
    *,
    fmt: str | None = None,
    delimiter: str | None = None,
    header: bool | None = None,
    given: dict[str, int | str | None] | None = None,
    relation_limit: int = 20,
) -> EdgeFileShape:
    """Look at ``path`` and read it once: separator, header, columns, edges, relations.

    ``delimiter``, ``header`` and the columns in ``given`` (role -> index, name, or None for
    "no relation column") are taken as given; the rest is worked out from the file.
    """
    from bigembed.edgelists.inputs import detect_format

    given = dict(given or {})
    fmt, compression = detect_format(path, fmt)
    if not path.is_file():
        raise InputError(
            f"{path}: input file not found" if not path.exists() else f"{path}: not a regular file"
        )
    why: dict[str, str] = {}
    if fmt == "parquet":
        names: list[str] | None = _parquet_names(path)
        width = len(names or [])
        text_header = False
    else:
        delimiter, text_header, names, width, why = _text_layout(
            path, fmt, compression, delimiter, header, given
        )
    spec, why["columns"] = _resolve(given, names, width, path)
    if fmt == "parquet":
        _check_parquet_types(path, spec)
    shape = EdgeFileShape(
        path=path,
        fmt=fmt,
        compression=compression,
        delimiter=delimiter if fmt != "parquet" else None,
        header=text_header,
        column_names=names or [],
        columns=spec,
        relation_limit=relation_limit,
        why=why,
    )
    if names is not None:  # name the columns where the name is unambiguous
        shape.columns = ColumnSpec(
            lhs=_label(names, spec.lhs), rel=_label(names, spec.rel), rhs=_label(names, spec.rhs)
        )
    source = InputFile(
        path,
        fmt,
        compression,
        shape.columns,
        TextOptions(header=text_header, delimiter=shape.delimiter),
        skip_bad_lines=False,
    )
    _scan(source, shape)
    return shape
