"""``bigembed init EDGES [--output CONFIG]``: a commented starting config for an edge file.

Reads the file once (:func:`bigembed.edgelists.inspect_edge_file`: separator, header, columns,
edges, relations) and writes a config that ``bigembed import CONFIG EDGES`` and then
``bigembed train CONFIG`` run as they are (:func:`bigembed.config.starter_config`). An existing
config is replaced only with ``--force``, and only one ``init`` wrote and nobody edited since.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from bigembed.commands.columns import column, optional_column

if TYPE_CHECKING:
    from bigembed.config import StarterPaths
    from bigembed.edgelists import EdgeFileShape

DESCRIPTION = """\
Look at an edge list (TSV/CSV, optionally .gz/.bz2/.zst, or Parquet; with or without a header
line) and write a commented starting config for it: how to read it (separator, header,
columns), one entity type, its relations (listed when there are few distinct values, else
dynamic_relations; one relation when there is no relation column), the entity/edge stores and
checkpoint in a directory beside the config, and a small model that trains at once:

  bigembed init friends.csv --output friends.yaml
  bigembed import friends.yaml friends.csv
  bigembed train friends.yaml

Flags fix what the file does not say clearly; the rest is read from the file."""


def _at_least_one(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "init",
        help="write a commented starting config for an edge list (CSV/TSV/Parquet)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("edges", type=Path, metavar="EDGES", help="the edge list to look at")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the config to write, .yaml (default: EDGES' name with .yaml, here)",
    )
    p.add_argument(
        "--format", choices=("tsv", "csv", "parquet"), help="when the extension does not tell"
    )
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the first line names the columns, or not (default: judged from the file)",
    )
    p.add_argument("--delimiter", help="field separator (default: judged from the file)")
    p.add_argument("-l", "--lhs-col", type=column, help="head column: index from 0 or name")
    p.add_argument(
        "--rel-col", type=optional_column, default=..., help="relation column, or 'none'"
    )
    p.add_argument("-r", "--rhs-col", type=column, help="tail column: index from 0 or name")
    p.add_argument(
        "--max-relations",
        type=_at_least_one,
        default=20,
        help="list up to this many distinct relations in the config; more: dynamic_relations "
        "(default 20)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a config that bigembed init wrote and nobody edited since",
    )
    p.set_defaults(func=run)


def _default_output(edges: Path) -> Path:
    name = edges.name
    for suffix in (".gz", ".bz2", ".zst"):
        name = name.removesuffix(suffix)
    return Path(Path(name).stem + ".yaml")


def _check_output(path: Path, edges: Path, force: bool) -> None:
    from bigembed.config import written_by_init
    from bigembed.errors import OutputExistsError
    from bigembed.output_paths import OutputError, refuse_overlap

    if path.suffix.lower() not in (".yaml", ".yml"):
        raise OutputError(f"{path}: init writes YAML; name the config .yaml")
    refuse_overlap([path], [edges])
    if not path.exists() and not path.is_symlink():
        return
    if not force:
        raise OutputExistsError(
            f"{path}: already exists; pass --force to replace it (only a config bigembed init "
            f"wrote and nobody edited since)"
        )
    if path.is_symlink() or not path.is_file():
        raise OutputError(f"{path}: not replaced, it is not a regular file")
    try:
        ours = written_by_init(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise OutputError(
            f"{path}: not replaced: bigembed init did not write it, or it was edited since; "
            f"remove it yourself or choose another --output"
        )


def run(args: argparse.Namespace) -> int:
    from bigembed.atomic import atomic_write_text
    from bigembed.config import StarterPaths, starter_config
    from bigembed.edgelists import inspect_edge_file
    from bigembed.output_paths import writing

    output: Path = args.output if args.output is not None else _default_output(args.edges)
    _check_output(output, args.edges, args.force)
    given: dict[str, int | str | None] = {}
    for role, value, unset in (
        ("lhs", args.lhs_col, None),
        ("rel", args.rel_col, ...),  # None is given: 'none', no relation column
        ("rhs", args.rhs_col, None),
    ):
        if value is not unset:
            given[role] = value
    shape = inspect_edge_file(
        args.edges,
        fmt=args.format,
        delimiter=args.delimiter,
        header=args.header,
        given=given,
        relation_limit=args.max_relations,
    )
    paths = StarterPaths.beside(output, Path.cwd())
    command = shlex.join(["bigembed", "init", str(args.edges)])
    text = starter_config(shape, paths, config=str(output), command=command)
    with writing(output, "config"):
        atomic_write_text(output, text)
    print(_summary(shape, output, paths))
    return 0


def _summary(shape: EdgeFileShape, output: Path, paths: StarterPaths) -> str:

    fmt = shape.fmt + (f", {shape.compression}" if shape.compression else "")
    read = [
        f"  {topic}: {shape.why[topic]}" for topic in ("delimiter", "header") if topic in shape.why
    ]
    cols = ", ".join(
        f"{role} {shape.column_label(r)}"
        for r, role in (("lhs", "head"), ("rel", "relation"), ("rhs", "tail"))
        if shape.column_label(r) is not None
    )
    if shape.columns.rel is None:
        rels = "one relation (no relation column)"
    elif shape.more_relations:
        rels = f"over {shape.relation_limit} distinct: dynamic_relations"
    else:
        top = list(shape.relation_counts.items())
        shown = ", ".join(f"{name} ({count:,})" for name, count in top[:5])
        rels = f"{len(top)} listed ({shown}{', ...' if len(top) > 5 else ''})"
    store = str(Path(paths.model).parent)
    return "\n".join(
        [
            f"Wrote {output} for {shape.path} ({shape.edges:,} edges, {fmt}):",
            *read,
            f"  columns: {cols} ({shape.why['columns']})",
            f"  relations: {rels}",
            f"  stores and checkpoint: {store}/ (entities, edges, model)",
            "Next:",
            f"  bigembed import {output} {shape.path}",
            f"  bigembed train {output}",
        ]
    )
