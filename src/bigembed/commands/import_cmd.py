"""``bigembed import CONFIG INPUT... [-p KEY=VALUE]``: edge lists -> entity and edge stores."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from bigembed.commands.columns import FROM_CONFIG, add_column_arguments, configured
from bigembed.config import add_config_arguments, config_from_args
from bigembed.edgelists import FORMATS, ColumnSpec, TextOptions
from bigembed.errors import InputError
from bigembed.importing import ImportOptions, run_import
from bigembed.writer_lock import hold

DESCRIPTION = """\
Import edge lists into the entity store (config entity_path) and one bucketed edge store per
config edge_paths entry (one INPUT per edge path, in order; all share one entity dictionary).
Inputs: .tsv/.txt (tab-separated), .csv, optionally .gz/.bz2/.zst, or .parquet.
Columns are given by 0-based index or, with --header or Parquet, by name; the config's
edge_files section (written by `bigembed init`) gives the defaults of --header, --delimiter
and the --*-col flags.
Outputs are published only when complete; bad lines stop the import naming FILE:LINE unless
--skip-bad-lines."""


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import",
        help="import edge lists (TSV/CSV/Parquet) into entity and edge stores",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT", help="edge list file(s), one per edge path"
    )
    parser.add_argument(
        "--format", choices=FORMATS, help="input format (default: from the file extension)"
    )
    add_column_arguments(parser, weight=True, from_config=True)
    parser.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=FROM_CONFIG,
        help="text inputs start (or not) with a line of column names (default: the config's "
        "edge_files.header, else no header)",
    )
    parser.add_argument(
        "--delimiter",
        default=FROM_CONFIG,
        help="field separator of text inputs, one character ('\\t': a tab; default: the "
        "config's edge_files.delimiter, else tab for tsv/txt, comma for csv)",
    )
    parser.add_argument(
        "--entity-min-count",
        type=_positive,
        default=1,
        help="drop entities seen fewer times (default 1)",
    )
    parser.add_argument(
        "--relation-type-min-count",
        type=_positive,
        default=1,
        help="dynamic relations: drop relation types with fewer edges (default 1)",
    )
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip and count malformed lines instead of stopping",
    )
    parser.add_argument("--force", action="store_true", help="replace existing entity/edge stores")
    parser.add_argument(
        "--allow-orphans",
        action="store_true",
        help="with --force: replace an entity store even when checkpoints trained on it would "
        "no longer match its names (keeps the old names for `bigembed remap`)",
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="add the new entities of INPUT to the existing entity store (every old entity "
        "keeps its partition and offset; new ones are appended to the smallest partitions) and "
        "re-bucket the edge stores; checkpoints trained on the old store grow with `bigembed "
        "train` (docs/growing.md)",
    )
    parser.add_argument(
        "--features",
        action="append",
        default=[],
        metavar="TYPE=FILE",
        help="the features of a featurized entity type (entity<TAB>feat1 feat2 ..., "
        "entity<TAB>feature<TAB>weight, or Parquet entity/features[/weights]; see "
        "docs/featurized.md); repeat per type",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--buffer-edges", type=_positive, default=ImportOptions.buffer_edges, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--run-edges", type=_positive, default=ImportOptions.run_edges, help=argparse.SUPPRESS
    )
    parser.set_defaults(func=run)


def _feature_files(values: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for value in values:
        etype, sep, path = value.partition("=")
        if not sep or not etype or not path:
            raise InputError(f"--features {value}: expected TYPE=FILE")
        out[etype] = Path(path)
    return out


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    files = cfg.edge_files
    options = ImportOptions(
        inputs=list(args.inputs),
        format=args.format,
        columns=ColumnSpec(
            lhs=configured(args.lhs_col, files.lhs_col),
            rel=configured(args.rel_col, files.rel_col),
            rhs=configured(args.rhs_col, files.rhs_col),
            weight=args.weight_col,
        ),
        text=TextOptions(
            header=configured(args.header, files.header),
            delimiter=configured(args.delimiter, files.delimiter),
        ),
        entity_min_count=args.entity_min_count,
        relation_type_min_count=args.relation_type_min_count,
        skip_bad_lines=args.skip_bad_lines,
        force=args.force,
        allow_orphans=args.allow_orphans,
        extend=args.extend,
        progress=not args.no_progress and sys.stderr.isatty(),
        buffer_edges=args.buffer_edges,
        run_edges=args.run_edges,
        features=_feature_files(args.features),
    )
    with contextlib.ExitStack() as held:  # one writer per store (bigembed.writer_lock)
        for store in dict.fromkeys([cfg.entity_path, *cfg.edge_paths]):
            held.enter_context(hold(store, "import"))
        summary = run_import(cfg, options)
    print(summary.format())
    return 0
