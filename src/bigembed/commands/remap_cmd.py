"""``bigembed remap CHECKPOINT_DIR``: a checkpoint's entity rows matched by name to a new import."""

from __future__ import annotations

import argparse

from bigembed.commands.versions import add_version_argument, checkpoint_of

DESCRIPTION = """\
Write a copy of a checkpoint whose entity rows follow the current import of its entity path,
matched by name: entities of both imports keep their embeddings and Adagrad state, new ones
start as a fresh model's, dropped ones are counted. Use it after `bigembed import --force
--allow-orphans` changed the entities a model was trained on (that import keeps the old names
in ENTITY_PATH/previous_imports/). The checkpoint itself is only read; the copy goes to a new
directory (default: CHECKPOINT_DIR-remapped), published only when complete."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "remap",
        help="match a checkpoint's entities by name to a new import of its entity path",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    p.add_argument(
        "--output", "-o", help="the new checkpoint directory (default: CHECKPOINT_DIR-remapped)"
    )
    p.add_argument("--entity-path", help="the new entity store (default: the checkpoint config's)")
    p.add_argument(
        "--from-entities",
        metavar="OLD_ENTITY_PATH",
        help="an entity store of the import the model was trained on (default: the names "
        "kept in ENTITY_PATH/previous_imports/)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    add_version_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.interop import default_output, remap_checkpoint

    summary = remap_checkpoint(
        checkpoint_of(args.checkpoint_dir, args),
        entity_path=args.entity_path,
        from_entities=args.from_entities,
        output=args.output if args.output is not None else default_output(args.checkpoint_dir),
        force=args.force,
    )
    if summary is None:
        print(
            f"{args.checkpoint_dir} already matches its entity store (same import id); "
            "nothing to remap"
        )
        return 0
    print(summary.format())
    return 0
