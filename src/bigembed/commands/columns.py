"""The column flags of every command that reads edge files (import, eval): one definition.

``--lhs-col``, ``--rel-col``, ``--rhs-col`` (and ``--weight-col`` where weights are read)
take a 0-based column index or, with ``--header`` or Parquet, a column name. The optional
ones (``--rel-col``, ``--weight-col``) also take ``none`` (or ``-``): no such column; without
a relation column every edge has the config's single relation.

``import`` takes its defaults from the config's ``edge_files`` section (``from_config``): a
flag given on the command line wins, an absent one leaves the config's value.
"""

from __future__ import annotations

import argparse
from typing import Any

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


#: The default of a flag whose value comes from the config when it is not given.
FROM_CONFIG = "(from the config)"


def add_column_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    weight: bool = False,
    from_config: bool = False,
) -> None:
    """Add ``--lhs-col``/``-l``, ``--rel-col``, ``--rhs-col``/``-r`` (and ``--weight-col``).

    With ``from_config`` an absent flag is :data:`FROM_CONFIG` (see :func:`configured`).
    """

    def default(value: int) -> tuple[Any, str]:
        if from_config:
            return FROM_CONFIG, f"default: the config's edge_files, else {value}"
        return value, f"default {value}"

    lhs, lhs_help = default(0)
    rel, rel_help = default(1)
    rhs, rhs_help = default(2)
    parser.add_argument(
        "-l",
        "--lhs-col",
        type=column,
        default=lhs,
        help=f"lhs (head) column: index from 0 or name ({lhs_help})",
    )
    parser.add_argument(
        "--rel-col",
        type=optional_column,
        default=rel,
        help="relation column: index from 0 or name, or 'none' when there is none (every edge "
        f"then has the config's single relation) ({rel_help})",
    )
    parser.add_argument(
        "-r",
        "--rhs-col",
        type=column,
        default=rhs,
        help=f"rhs (tail) column: index from 0 or name ({rhs_help})",
    )
    if weight:
        parser.add_argument(
            "--weight-col",
            type=optional_column,
            default=None,
            help="edge weight column: index from 0 or name, or 'none' (default: none)",
        )


def configured(flag: Any, config_value: Any) -> Any:
    """The flag's value when it was given, else the config's."""
    return config_value if flag is FROM_CONFIG else flag
