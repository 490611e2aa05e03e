"""``--version latest|best``: which version of a checkpoint a reading command uses (one flag).

Without the flag a reading command uses the best version when early stopping kept one (and
says so on stderr, one line), else the latest: see :mod:`bigembed.checkpoints.version_choice`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        dest="checkpoint_version",
        choices=("latest", "best"),
        default=None,
        help="best: the version early stopping kept (CHECKPOINT/best); latest: the last "
        "committed version. Default: best when early stopping kept one (said on stderr), "
        "else latest",
    )


def checkpoint_of(path: str, args: argparse.Namespace, outputs: Sequence[str | Path] = ()) -> Path:
    """The checkpoint directory holding the version the user asked for (or the default one,
    named in one line on stderr when it is early stopping's best). ``outputs`` are refused
    inside the whole checkpoint directory ``path``, whichever version is read (``best/`` is
    only part of it)."""
    from bigembed.checkpoints import choose_version
    from bigembed.output_paths import refuse_overlap

    refuse_overlap(outputs, [path])

    chosen = choose_version(path, getattr(args, "checkpoint_version", None))
    if chosen.note is not None:
        command = getattr(args, "command", None)
        prefix = f"bigembed {command}: " if command else ""
        hint = " (--version latest reads it)" if chosen.latest_differs else ""
        print(f"{prefix}{chosen.note}{hint}", file=sys.stderr)
    return chosen.directory
