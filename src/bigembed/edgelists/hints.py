"""Column and delimiter mistakes of an edge input: the checks, and what would work instead.

``--delimiter`` must be one character and a selected Parquet column one value per row (checked
up front, in one line naming the flag or the column). On the error path of
:mod:`bigembed.edgelists.inputs`: when a named column is not in
the header, or a column index is past the last column, the first line is split at the other
likely separators; one that yields the wanted columns becomes a ``--delimiter`` suggestion, and
otherwise a column name close to the wanted one becomes a ``--X-col`` suggestion.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from bigembed.errors import InputError

#: Tried in this order: space last, since names often hold spaces.
LIKELY_DELIMITERS = (";", "\t", ",", "|", " ")
#: How ``--delimiter`` spells a tab (``'\t'`` in the shell arrives as backslash + t).
DELIMITER_ESCAPES = {"\\t": "\t", "tab": "\t", "TAB": "\t"}
FIRST_LINE_BYTES = 1 << 16
MAX_SHOWN = 8
SED_SPECIAL = "/'\\.*[]^$"  # a separator holding these would need escaping in the sed hint


def shown_delimiter(delimiter: str) -> str:
    """The delimiter as the user would type it after ``--delimiter``."""
    return "'\\t'" if delimiter == "\t" else repr(delimiter)


def shown_names(names: Sequence[str], limit: int = MAX_SHOWN) -> str:
    """``a, b, c`` or ``a, b, ... and 12 more``: a message never lists a whole wide header."""
    head = ", ".join(names[:limit])
    more = len(names) - limit
    return f"{head} and {more} more" if more > 0 else head


def first_line(path: Path, compression: str | None) -> str | None:
    """The first non-empty line of a text input (decompressed), or None if unreadable."""
    try:
        with pa.input_stream(os.fspath(path), compression=compression) as stream:
            head = stream.read(FIRST_LINE_BYTES)
    except (OSError, pa.ArrowException):
        return None
    for line in head.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line
    return None


def _fields(line: str, delimiter: str) -> list[str]:
    return [f.strip().strip('"') for f in line.split(delimiter)]


def delimiter_hint(
    line: str | None, current: str, *, names: Sequence[str] = (), width: int = 0
) -> str:
    """``; ... pass --delimiter ';'`` when another likely separator splits ``line`` (the first
    line of the file) into fields that hold every one of ``names`` (a header) or at least
    ``width`` fields; else ``""``."""
    if line is None:
        return ""
    for candidate in LIKELY_DELIMITERS:
        if candidate == current:
            continue
        fields = _fields(line, candidate)
        if len(fields) < 2 or "" in fields:
            continue
        if (names and all(n in fields for n in names)) or (not names and len(fields) >= width):
            flag = shown_delimiter(candidate)
            return (
                f"; the first line splits at {flag} into {len(fields)} columns "
                f"({shown_names(fields)}): pass --delimiter {flag}"
            )
    return ""


def column_hint(wanted: str, columns: Sequence[str], flag: str) -> str:
    """``; did you mean --lhs-col source?`` for the column closest to ``wanted``, or ``""``."""
    lowered = {c.lower(): c for c in columns}
    close = [lowered[wanted.lower()]] if wanted.lower() in lowered else []
    close = close or [c for c in columns if c.lower().startswith(wanted.lower())]
    close = close if len(close) == 1 else []  # an abbreviation of exactly one column
    close = close or difflib.get_close_matches(wanted, list(columns), n=1, cutoff=0.6)
    return f"; did you mean {flag} {close[0]!r}?" if close else ""


def check_delimiter(delimiter: str) -> str:
    """The one-character separator ``--delimiter`` asks for (``\\t`` or ``tab``: a tab).

    pyarrow's CSV reader splits at one ASCII character, so a longer separator is refused here,
    in one line naming the flag, rather than deep inside the reader.
    """
    value = DELIMITER_ESCAPES.get(delimiter, delimiter)
    single = len(value) == 1 and value.isascii() and (value.isprintable() or value == "\t")
    if single and value != '"':
        return value
    if len(value) > 1:
        plain = not set(value) & set(SED_SPECIAL)
        how = "e.g. sed 's/" + value + "/\\t/g'" if plain else "e.g. with sed"
        why = (
            "a separator must be one character (pyarrow's CSV reader splits at one); turn "
            f"{delimiter!r} into tabs first ({how}) and import the result as .tsv"
        )
    else:
        why = "must be one printable ASCII character other than '\"' (or '\\t' for a tab)"
    raise InputError(f"--delimiter {delimiter!r}: {why}")


def check_parquet_types(path: Path, schema: pa.Schema, selected: dict[str, str]) -> None:
    """Refuse a selected Parquet column of lists, structs or maps (``selected``: role -> column
    name): a name or weight is one value per row; Arrow cannot cast those to text, and guessing
    which element is meant would import the wrong edges."""
    for role, name in selected.items():
        kind = schema.field(name).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if pa.types.is_nested(kind):
            how = (
                "make the field you mean a column of its own (e.g. pyarrow's Table.flatten)"
                if pa.types.is_struct(kind)
                else "explode it to one row per element first"
            )
            raise InputError(
                f"{path}: column {name!r} (--{role}-col) holds {kind} values, not one name per "
                f"row; {how}"
            )
