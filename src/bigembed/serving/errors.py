"""The errors of a query, each a :class:`~bigembed.errors.InputError` (one line for the CLI)
and the built-in exception API users expect (``KeyError``, ``ValueError``), and the checks of
query arguments that raise them (messages about many names show a few)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from bigembed.errors import InputError

SHOWN = 3  # names shown in a message about many: the first three, then "and N more"


class UnknownNameError(InputError, KeyError):
    """An entity or relation name the model does not know (a KeyError too, for API users)."""

    __str__ = Exception.__str__  # KeyError would quote the message


class QueryError(InputError, ValueError):
    """A query argument of the wrong kind: ``k``, ``side``, ``metric``, a name that is not a
    string (a ValueError too, for API users)."""


def check_k(k: object) -> int:
    """``k`` as an int, or :class:`QueryError` unless it is a positive integer."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise QueryError(f"k must be a positive integer, got {k!r}")
    return int(k)


def check_name(name: object) -> str:
    """``name``, or :class:`QueryError` unless it is a string."""
    if not isinstance(name, str):
        raise QueryError(f"entity names are strings, got {short_repr(name)}")
    return name


def show_values(values: Sequence[object], limit: int = SHOWN) -> str:
    """The first ``limit`` values and how many more: ``'a', 'b', 'c' and 97 more``, so that a
    message about a long list of names stays one short line."""
    shown = ", ".join(_clip(repr(v)) for v in list(values[:limit]))
    more = len(values) - limit
    return f"{shown} and {more:,} more" if more > 0 else shown


def short_repr(value: object) -> str:
    """``value`` for a message: a list, tuple or array by its kind, length and first few items;
    anything else by a repr cut to a line."""
    kind = type(value).__name__
    if isinstance(value, (list, tuple, np.ndarray)):
        items = value.tolist() if isinstance(value, np.ndarray) else value
        if isinstance(value, np.ndarray) and value.ndim != 1:
            return f"a {kind} of shape {tuple(value.shape)}"
        return f"a {kind} of {len(items):,} ({show_values(items)})"
    return f"{_clip(repr(value))} ({kind})"


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def broadcast(*values: object) -> list[list]:
    """Lists of equal length from single values and sequences."""
    lists = [
        [v] if isinstance(v, (str, bytes)) or not isinstance(v, Iterable) else list(v)
        for v in values
    ]
    n = max(len(v) for v in lists)
    out = []
    for v in lists:
        if len(v) == 1:
            v = v * n
        elif len(v) != n:
            lengths = ", ".join(str(len(x)) for x in lists)
            raise QueryError(f"got sequences of different lengths ({lengths})")
        out.append(v)
    return out
