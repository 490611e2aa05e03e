"""The column flags of every command that reads edge files (import, eval): one definition.

``--lhs-col``, ``--rel-col``, ``--rhs-col`` (and ``--weight-col`` where weights are read)
take a 0-based column index or, with ``--header`` or Parquet, a column name. The optional
ones (``--rel-col``, ``--weight-col``) also take ``none`` (or ``-``): no such column; without
a relation column every edge has the config's single relation.
"""

from __future__ import annotations

import argparse

NONE_WORDS = ("none", "-")


def column(value: str) -> int | str:
    """A column index (>= 0) or name, for argparse ``type=``."""
    text = value.strip()
    if not text:
        raise argparse.ArgumentTypeError("empty column (give an index from 0 or a name)")
    if text.lstrip("-").isdigit():
        index = int(text)
        if index < 0:
            raise argparse.ArgumentTypeError(
                f"column index {index} is negative (columns count from 0; 'none' for no column)"
            )
        return index
    return text


def optional_column(value: str) -> int | str | None:
    """:func:`column`, or ``None`` for ``none`` / ``-`` (and ``-1``, which means the same)."""
    if value.strip().lower() in (*NONE_WORDS, "-1"):
        return None
    return column(value)


def add_column_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, weight: bool = False
) -> None:
    """Add ``--lhs-col``/``-l``, ``--rel-col``, ``--rhs-col``/``-r`` (and ``--weight-col``)."""
    parser.add_argument(
        "-l",
        "--lhs-col",
        type=column,
        default=0,
        help="lhs (head) column: index from 0 or name (default 0)",
    )
    parser.add_argument(
        "--rel-col",
        type=optional_column,
        default=1,
        help="relation column: index from 0 or name, or 'none' when there is none (every edge "
        "then has the config's single relation) (default 1)",
    )
    parser.add_argument(
        "-r",
        "--rhs-col",
        type=column,
        default=2,
        help="rhs (tail) column: index from 0 or name (default 2)",
    )
    if weight:
        parser.add_argument(
            "--weight-col",
            type=optional_column,
            default=None,
            help="edge weight column: index from 0 or name, or 'none' (default: none)",
        )
