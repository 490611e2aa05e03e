"""``bigembed export CHECKPOINT_DIR --format F --output DIR``: embeddings out of a checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from bigembed.commands.versions import add_version_argument, checkpoint_of


def register(subparsers: argparse._SubParsersAction) -> None:
    from_formats = ("tsv", "npy", "parquet", "projector")
    p = subparsers.add_parser(
        "export",
        help="export embeddings and relation parameters (tsv, npy, parquet, projector)",
        description="Write a checkpoint's entity embeddings (with names; the global embedding "
        "added when the model has one) and relation parameters: tsv = PBG's layout "
        "(entities.tsv, relation_types.tsv); npy = one array and one names file per entity "
        "type; parquet = name + vector columns; projector = TensorBoard Embedding Projector "
        "files (vectors.tsv, metadata.tsv). The output directory appears only when complete.",
    )
    p.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    p.add_argument("--format", required=True, choices=from_formats, dest="fmt")
    p.add_argument("--output", "-o", required=True, help="output directory (must not exist)")
    p.add_argument("--entity-path", help="entity names (default: the checkpoint config's)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    add_version_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.export import export_checkpoint
    from bigembed.writer_lock import hold

    with hold(args.output, "export"):
        return _run(args, export_checkpoint)


def _run(args: argparse.Namespace, export_checkpoint: Any) -> int:
    manifest = export_checkpoint(
        checkpoint_of(args.checkpoint_dir, args, outputs=[args.output]),
        args.fmt,
        args.output,
        entity_path=args.entity_path,
        force=args.force,
    )
    counts = ", ".join(
        f"{t}: {v['count']:,} x {v['dimension']}" for t, v in manifest["entity_types"].items()
    )
    print(
        f"Exported {counts} and {manifest['relation_params']} relation parameter(s) as "
        f"{args.fmt} to {args.output}: {', '.join(manifest['files'])}"
    )
    return 0
