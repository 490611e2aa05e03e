"""``bigembed eval CONFIG``: rank held-out edges against all entities, raw and filtered."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.commands.columns import add_column_arguments
from bigembed.commands.versions import add_version_argument, checkpoint_of
from bigembed.config import ConfigSchema, add_config_arguments


def add_edge_file_arguments(p: argparse.ArgumentParser) -> None:
    """Options for reading edge *files* of names (imported edge paths need none of them)."""
    g = p.add_argument_group("edge files of names (TSV/CSV/Parquet)")
    add_column_arguments(g)
    g.add_argument("--header", action="store_true", help="text files start with a header line")
    g.add_argument(
        "--delimiter", help="text field separator (default: tab for .tsv/.txt, comma for .csv)"
    )
    g.add_argument(
        "--format",
        choices=("tsv", "csv", "parquet"),
        dest="input_format",
        help="file format when the extension does not tell",
    )
    g.add_argument(
        "--skip-unknown",
        action="store_true",
        help="leave out (and count) edges whose entity or relation names the model "
        "does not know, instead of stopping at the first",
    )


def file_options(args: argparse.Namespace):
    from bigembed.edgelists import ColumnSpec, TextOptions
    from bigembed.eval import FileOptions

    return FileOptions(
        columns=ColumnSpec(lhs=args.lhs_col, rel=args.rel_col, rhs=args.rhs_col),
        text=TextOptions(header=args.header, delimiter=args.delimiter),
        format=args.input_format,
        skip_unknown=args.skip_unknown,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a trained model: MRR, Hits@k, mean rank, AUC (raw and filtered)",
        description="Rank each edge's head and tail against every entity of their type "
        "(full ranking, the default) or against sampled negatives like PBG's "
        "torchbiggraph_eval (--protocol sampled), and report MRR, MR, Hits@1/3/10/50 and AUC, "
        "raw and filtered (known true edges left out of the candidates).",
    )
    add_config_arguments(p)
    p.add_argument(
        "--edges",
        nargs="+",
        metavar="PATH",
        help="edge sets to evaluate: imported edge paths or TSV/CSV/Parquet files of "
        "names (default: the config's edge_paths)",
    )
    p.add_argument(
        "--filter-edges",
        nargs="+",
        metavar="PATH",
        help="known true edges to filter with (default: the config's edge_paths); "
        "the evaluated edges are always included",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--filtered",
        dest="filtered",
        action="store_true",
        default=True,
        help="report raw and filtered metrics (default)",
    )
    group.add_argument(
        "--raw-only",
        dest="filtered",
        action="store_false",
        help="report raw metrics only (no filter sets needed)",
    )
    p.add_argument(
        "--exclude-self",
        action="store_true",
        help="in the filtered metrics, never count the query's own entity as a candidate "
        "(relations within one entity type, e.g. follows: nobody is their own answer)",
    )
    p.add_argument("--per-relation", action="store_true", help="also report each relation")
    p.add_argument(
        "--protocol",
        choices=("full", "sampled"),
        default="full",
        help="full: against all entities of the type (default); sampled: against the "
        "config's num_batch_negs / num_uniform_negs from the same partition, like PBG",
    )
    p.add_argument("--output", metavar="FILE.json", help="also write the report as JSON here")
    p.add_argument("--force", action="store_true", help="replace an existing --output report")
    p.add_argument("--entity-path", help="entity names (default: the config's entity_path)")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        help="queries scored at once (1024); one block of scores holds at most "
        "16M floats whatever the graph size",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="evaluate on num_machines ranks (distributed_init_method of the config): this "
        "one's rank; each ranks a cost-balanced share of the edges and rank 0 prints and writes "
        "the merged report (the same as on one machine); under torchrun or srun the rank is "
        "the launcher's (RANK, SLURM_PROCID) and num_machines its world size",
    )
    add_version_argument(p)
    add_edge_file_arguments(p)
    from bigembed.distributed import add_security_arguments

    add_security_arguments(p)  # with --rank: shared secret, bind address
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import contextlib

    from bigembed.commands.launched import placed_config
    from bigembed.writer_lock import hold

    cfg, rank = placed_config(args, partition_servers=False)  # --rank, torchrun's, SLURM's
    writes = args.output and rank in (None, 0)  # rank 0 writes a distributed report
    with hold(args.output, "eval") if writes else contextlib.nullcontext():
        return _run(args, cfg, rank)


def _run(args: argparse.Namespace, cfg: ConfigSchema, rank: int | None) -> int:
    from bigembed.eval import evaluate_checkpoint

    checkpoint = cfg.checkpoint_path  # the whole directory stays an input, best/ or not
    chosen = checkpoint_of(checkpoint, args)  # early stopping's best by default
    if chosen != Path(checkpoint):
        cfg = cfg.model_copy(update={"checkpoint_path": str(chosen)})

    def check_output() -> None:  # refused before any work: never over an input, nor a report
        from bigembed.output_paths import check_output_file  # unless --force

        inputs = [
            args.config,
            checkpoint,
            args.entity_path or cfg.entity_path,
            *(args.edges or cfg.edge_paths),
            *(args.filter_edges or []),
        ]
        check_output_file(args.output, "eval-report", force=args.force, inputs=inputs)

    options = dict(
        filtered=args.filtered,
        per_relation=args.per_relation,
        protocol=args.protocol,
        entity_path=args.entity_path,
        file_options=file_options(args),
        chunk_size=max(1, args.chunk_size),
        exclude_self=args.exclude_self,
    )
    if rank is not None:
        from bigembed.distributed import apply_security_arguments, eval_distributed

        apply_security_arguments(args)
        done = eval_distributed(
            cfg,
            rank=rank,
            edge_paths=args.edges,
            filter_paths=args.filter_edges,
            progress=not args.no_progress,
            before=check_output if args.output else None,
            **options,
        )
        print(
            f"Rank {done.rank}: ranked {done.ranked:,} of the {done.total:,} edges"
            + ("; the report merges every rank's" if done.report else "; rank 0 reports")
        )
        if done.report is None:
            return 0
        report = done.report
    else:
        if args.output:
            check_output()
        report = evaluate_checkpoint(
            cfg, args.edges, args.filter_edges, progress=not args.no_progress, **options
        )
    print(report.table())
    if args.output:
        from bigembed.output_paths import writing

        with writing(args.output, "eval report"):
            report.write_json(args.output)
        print(f"Wrote {args.output}")
    return 0
