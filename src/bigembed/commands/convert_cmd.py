"""``bigembed convert from-pbg|to-pbg``: move checkpoints between PyTorch-BigGraph and bigembed."""

from __future__ import annotations

import argparse

from bigembed.commands.versions import add_version_argument, checkpoint_of


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert checkpoints from or to PyTorch-BigGraph's layout (needs h5py)",
        description="Convert a trained model between PyTorch-BigGraph (HDF5 checkpoint + JSON "
        "entity names) and bigembed. Embeddings, relation parameters, global embeddings, "
        "entity and relation names and the checkpoint version are kept exactly; optimizer "
        "state and edge paths are not converted.",
    )
    sub = p.add_subparsers(dest="direction", metavar="DIRECTION")
    sub.required = True
    f = sub.add_parser("from-pbg", help="PBG checkpoint + entity path -> bigembed")
    f.add_argument("pbg_checkpoint", metavar="PBG_CHECKPOINT_DIR")
    f.add_argument("pbg_entity_path", metavar="PBG_ENTITY_PATH")
    f.add_argument("out_checkpoint", metavar="OUT_CHECKPOINT_DIR")
    f.add_argument("out_entity_path", metavar="OUT_ENTITY_PATH")
    f.add_argument("--force", action="store_true", help="replace existing outputs")
    f.set_defaults(func=run)
    t = sub.add_parser("to-pbg", help="bigembed checkpoint + entity path -> PBG")
    t.add_argument("checkpoint", metavar="CHECKPOINT_DIR")
    t.add_argument(
        "entity_path",
        metavar="ENTITY_PATH",
        help="bigembed entity path ('-' = the one in the checkpoint's config)",
    )
    t.add_argument("out_checkpoint", metavar="OUT_PBG_CHECKPOINT_DIR")
    t.add_argument("out_entity_path", metavar="OUT_PBG_ENTITY_PATH")
    t.add_argument("--force", action="store_true", help="replace existing outputs")
    add_version_argument(t)
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.writer_lock import hold

    what = f"convert {args.direction}"
    with hold(args.out_checkpoint, what), hold(args.out_entity_path, what):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from bigembed.interop import from_pbg, to_pbg

    if args.direction == "from-pbg":
        summary = from_pbg(
            args.pbg_checkpoint,
            args.pbg_entity_path,
            args.out_checkpoint,
            args.out_entity_path,
            force=args.force,
        )
    else:
        entity_path = None if args.entity_path == "-" else args.entity_path
        outputs = [args.out_checkpoint, args.out_entity_path]
        summary = to_pbg(
            checkpoint_of(args.checkpoint, args, outputs=outputs),
            entity_path,
            args.out_checkpoint,
            args.out_entity_path,
            force=args.force,
        )
    counts = ", ".join(f"{k}: {v:,}" for k, v in summary["entity_counts"].items())
    print(
        f"Converted version {summary['version']} ({counts}; {summary['relations']} relation "
        f"type(s)) to {summary['checkpoint']} and {summary['entity_path']}"
    )
    return 0
