"""``bigembed datasets [list]`` and ``bigembed datasets NAME --output DIR``: the bundled datasets.

``NAME --output DIR`` writes the dataset's splits as plain TSV files (``DIR/train.txt``,
``DIR/valid.txt``, ``DIR/test.txt``), ready for ``bigembed import``. DIR is published whole
when complete and carries bigembed's output marker, so ``--force`` replaces only a directory
this command wrote (:mod:`bigembed.output_paths`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.atomic import atomic_directory
from bigembed.datasets import BUNDLED, write_dataset
from bigembed.errors import BigembedError
from bigembed.output_paths import check_replaceable, writing

KIND = "dataset"

DESCRIPTION = """\
List the datasets bundled with bigembed, or write one as TSV edge lists (head, relation, tail;
one file per split) into a new directory, ready for `bigembed import`:

  bigembed datasets list
  bigembed datasets fb15k237 --output data/fb15k237"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "datasets",
        help="list the bundled datasets, or write one as TSV files (train/valid/test)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "name",
        nargs="?",
        default="list",
        metavar="NAME",
        help=f"'list' (the default) or a dataset: {', '.join(BUNDLED)}",
    )
    p.add_argument("-o", "--output", type=Path, help="directory to write the dataset's files to")
    p.add_argument(
        "--force", action="store_true", help="replace a directory this command wrote before"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        if args.output is not None:
            raise BigembedError(
                "--output needs a dataset name: bigembed datasets NAME --output DIR"
            )
        width = max(len(name) for name in BUNDLED)
        for name, dataset in BUNDLED.items():
            print(f"{name:<{width}}  {dataset.description}")
        return 0
    if args.name not in BUNDLED:
        raise BigembedError(
            f"no bundled dataset {args.name!r} (bundled: {', '.join(BUNDLED)}; "
            f"'bigembed datasets list' describes them)"
        )
    if args.output is None:
        raise BigembedError(
            f"where to? pass --output DIR (e.g. bigembed datasets {args.name} "
            f"--output data/{args.name})"
        )
    dataset = BUNDLED[args.name]
    out: Path = args.output
    check_replaceable(out, KIND, force=args.force)  # refuse before any work
    with writing(out, "dataset"), atomic_directory(out, force=args.force, marker=KIND) as tmp:
        written = write_dataset(dataset, tmp)
    print(f"Wrote {dataset.name} to {out}:")
    for split, path in written.items():
        print(f"  {split:<5} {out / path.name}")
    return 0
