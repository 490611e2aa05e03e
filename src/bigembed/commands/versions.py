"""``--version latest|best``: which version of a checkpoint a reading command uses (one flag)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        dest="checkpoint_version",
        choices=("latest", "best"),
        default="latest",
        help="latest: the last committed version (default); best: the version early stopping "
        "kept (CHECKPOINT/best)",
    )


def checkpoint_of(path: str, args: argparse.Namespace) -> Path:
    """The checkpoint directory holding the version the user asked for."""
    from bigembed.checkpoints import checkpoint_dir

    return checkpoint_dir(path, getattr(args, "checkpoint_version", "latest"))
