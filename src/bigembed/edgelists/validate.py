"""Vectorised checks of one record batch: names, relation names and weights.

Each check returns a boolean "bad" mask over the batch rows plus the reason, so the importer
can either stop at the first bad row (naming its line) or drop and count the bad rows.
Python-level loops run only over rows already known to be bad, or over a batch whose UTF-8
check failed (to find which strings are at fault).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EMPTY_NAME = "empty entity name"
EMPTY_RELATION = "empty relation name"
BAD_UTF8 = "non-UTF-8 bytes"
NUL_BYTE = "NUL byte in a name"
BAD_WEIGHT = "bad weight"
UNKNOWN_RELATION = "unknown relation"
WRONG_WIDTH = "wrong number of columns"


@dataclass
class Problem:
    """The bad rows of one check: mask over the batch and a reason per row."""

    mask: np.ndarray
    reason: str
    detail: dict[int, str] | None = None  # row -> extra text, only for the first few rows

    def describe(self, row: int) -> str:
        extra = (self.detail or {}).get(row)
        return f"{self.reason} ({extra})" if extra else self.reason


def as_strings(column: pa.Array) -> pa.Array:
    """Any column as a ``string`` array (nulls kept); bytes are not validated here."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    t = column.type
    if t == pa.string():
        return column
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return column.cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return column.cast(pa.binary()).view(pa.string())
    return pc.cast(column, pa.string())


def _lengths(values: pa.Array) -> np.ndarray:
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + n + 1
    ]
    return np.diff(offsets)


def has_nul(values: pa.Array) -> np.ndarray:
    """Mask of the strings holding a NUL byte (which C tools and many formats truncate at)."""
    found = pc.match_substring(values.view(pa.binary()), b"\x00")
    return pc.fill_null(found, False).to_numpy(zero_copy_only=False)


def check_names(values: pa.Array, reason_empty: str) -> tuple[pa.Array, list[Problem]]:
    """(strings, problems) of a name column: nulls/empty strings, NUL bytes, invalid UTF-8."""
    values = as_strings(values)
    problems = []
    empty = _lengths(values) == 0
    if values.null_count:
        empty |= values.is_null().to_numpy(zero_copy_only=False)
        values = pc.fill_null(values, "")
    if empty.any():
        problems.append(Problem(empty, reason_empty))
    nul = has_nul(values)
    if nul.any():
        problems.append(Problem(nul, NUL_BYTE))
    try:
        values.validate(full=True)
    except pa.ArrowInvalid:
        raw = values.view(pa.binary()).to_pylist()
        bad = np.zeros(len(values), dtype=bool)
        for i, item in enumerate(raw):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
        problems.append(Problem(bad, BAD_UTF8))
    return values, problems


def _parse_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def check_weights(column: pa.Array) -> tuple[np.ndarray, list[Problem]]:
    """float32 weights and the rows whose weight is missing, unparsable, negative or not finite."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    detail: dict[int, str] = {}
    try:
        weights = pc.cast(column, pa.float64())
        values = pc.fill_null(weights, math.nan).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        texts = as_strings(column).to_pylist()
        parsed = [_parse_float(t) for t in texts]
        values = np.array([math.nan if p is None else p for p in parsed], dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        texts_bad = as_strings(column.filter(pa.array(bad))).to_pylist()
        for row, text in zip(np.flatnonzero(bad)[:5].tolist(), texts_bad[:5], strict=False):
            detail[row] = f"{text!r}; weights must be finite numbers >= 0"
        return values.astype(np.float32), [Problem(bad, BAD_WEIGHT, detail)]
    return values.astype(np.float32), []


def combine(problems: list[Problem], n: int) -> np.ndarray | None:
    """The union of the problems' masks, or None when every row is good."""
    if not problems:
        return None
    bad = np.zeros(n, dtype=bool)
    for p in problems:
        bad |= p.mask
    return bad if bad.any() else None


def first_problem(problems: list[Problem]) -> tuple[int, str]:
    """(row, description) of the first bad row across all problems."""
    best: tuple[int, str] | None = None
    for p in problems:
        rows = np.flatnonzero(p.mask)
        if rows.size and (best is None or rows[0] < best[0]):
            best = (int(rows[0]), p.describe(int(rows[0])))
    assert best is not None
    return best
