"""``bigembed plot CHECKPOINT_DIR``: loss and eval curves from training_stats.json, as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.errors import CheckpointError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot", help="draw loss and eval curves of a training run to a PNG")
    p.add_argument("checkpoint_dir", help="a checkpoint directory (checkpoint_path)")
    p.add_argument("-o", "--output", help="PNG file (default: CHECKPOINT_DIR/training.png)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.train.checkpoint import CheckpointStore
    from bigembed.train.plotting import plot_training

    store = CheckpointStore(args.checkpoint_dir)
    if not store.path.is_dir():
        raise CheckpointError(f"{store.path}: no such checkpoint directory")
    records = store.read_stats(max_version=store.committed_version())
    if not records:
        raise CheckpointError(f"{store.path}: no training stats yet (training_stats.json is empty)")
    out = Path(args.output) if args.output else store.path / "training.png"
    plot_training(records, out)
    print(f"Wrote {out}")
    return 0
