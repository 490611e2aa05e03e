"""The errors of a query, each a :class:`~bigembed.errors.InputError` (one line for the CLI)
and the built-in exception API users expect (``KeyError``, ``ValueError``)."""

from __future__ import annotations

import numpy as np

from bigembed.errors import InputError


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
        raise QueryError(f"entity names are strings, got {name!r} ({type(name).__name__})")
    return name
