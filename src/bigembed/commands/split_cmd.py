"""``bigembed split INPUT --output DIR``: edge list -> train / valid / test files to import."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.commands.columns import add_column_arguments

DESCRIPTION = """\
Split an edge list (TSV/CSV, optionally .gz/.bz2/.zst, or Parquet) into DIR/train, DIR/valid
and DIR/test files of the same format, ready for `bigembed import` (lines are copied as they
are: same separator, header and extra columns). The split is reproducible: the same input,
fractions and --seed give the same files. A bad line stops the split naming FILE:LINE and
nothing is written."""


def _fraction(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"{x} is not a fraction in [0, 1)")
    return x


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "split",
        help="split an edge list into train/valid/test files (reproducible, by relation)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", type=Path, metavar="INPUT", help="the edge list to split")
    p.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    p.add_argument("--valid", type=_fraction, default=0.1, help="fraction for valid (0.1)")
    p.add_argument("--test", type=_fraction, default=0.1, help="fraction for test (0.1)")
    p.add_argument(
        "--by-relation",
        action="store_true",
        help="draw the fractions within each relation (every relation in every part)",
    )
    p.add_argument(
        "--keep-entities-in-train",
        action="store_true",
        help="move to train every valid/test edge whose head or tail train lacks",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    add_column_arguments(p)
    p.add_argument("--header", action="store_true", help="text input starts with column names")
    p.add_argument(
        "--delimiter", help="field separator of text input (default: tab for tsv/txt, comma csv)"
    )
    p.add_argument(
        "--format",
        choices=("tsv", "csv", "parquet"),
        dest="input_format",
        help="input format when the extension does not tell",
    )
    p.add_argument("--force", action="store_true", help="replace an earlier split in DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.edgelists import ColumnSpec, SplitOptions, TextOptions, split_edges

    opts = SplitOptions(
        valid=args.valid,
        test=args.test,
        by_relation=args.by_relation,
        keep_entities_in_train=args.keep_entities_in_train,
        seed=args.seed,
        columns=ColumnSpec(lhs=args.lhs_col, rel=args.rel_col, rhs=args.rhs_col),
        text=TextOptions(header=args.header, delimiter=args.delimiter),
        format=args.input_format,
        force=args.force,
    )
    from bigembed.writer_lock import hold

    with hold(args.output, "split"):
        print(split_edges(args.input, args.output, opts).format())
    return 0
