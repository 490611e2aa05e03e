"""``bigembed plot CHECKPOINT_DIR``: loss and eval curves from training_stats.json, as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.errors import CheckpointError
from bigembed.output_paths import check_output_file, writing


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot",
        help="draw loss, withheld-edge eval and validation (early stopping) curves to a PNG",
    )
    p.add_argument("checkpoint_dir", help="a checkpoint directory (checkpoint_path)")
    p.add_argument(
        "-o",
        "--output",
        help="PNG file (default: CHECKPOINT_DIR/training.png); an existing file is replaced "
        "only if it is a PNG image",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.checkpoints import CheckpointStore
    from bigembed.train import plot_training, read_training_log

    store = CheckpointStore(args.checkpoint_dir)
    if not store.path.is_dir():
        raise CheckpointError(f"{store.path}: no such checkpoint directory")
    log = read_training_log(store, max_version=store.committed_version())
    if not log.steps and not log.buckets:
        raise CheckpointError(f"{store.path}: no training stats yet (training_stats.json is empty)")
    out = Path(args.output) if args.output else store.path / "training.png"
    # the default lives in the checkpoint directory: refuse only what plot reads, and replace
    # only an earlier PNG (never a checkpoint file, a directory or a file of the user's)
    read = [
        store.path / "training_stats.json",
        store.path / "checkpoint_version.txt",
        store.path / "validation_stats.json",
    ]
    check_output_file(out, "png", force=False, inputs=read)
    with writing(out, "plot"):
        plot_training(log, out, store.read_validation(max_version=store.committed_version()))
    print(f"Wrote {out}")
    return 0
