"""Which version of a checkpoint a reader uses when the user does not say: the best one when
early stopping kept one, else the latest.

Early stopping keeps the version with the best validation metric in ``CHECKPOINT/best/`` and
training goes on for ``patience`` more evaluations, so the latest version is by construction
not the one to use. Reading commands (query, export, eval, convert) and ``bigembed.load``
therefore default to ``best/`` when it exists and say so in one line (:attr:`ChosenVersion.note`),
and ``latest`` stays one flag away. Training, early stopping and tuning never go through here:
they read and evaluate the latest committed version on purpose.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigembed.checkpoints.layout import BEST_DIR
from bigembed.checkpoints.reading import checkpoint_dir
from bigembed.checkpoints.store import CheckpointStore
from bigembed.errors import CheckpointError


@dataclass(frozen=True)
class ChosenVersion:
    """The directory to read (``path`` or ``path/best``) and, when the choice was made for the
    user, one line saying which version that is and why (None otherwise)."""

    directory: Path
    note: str | None = None
    #: the best version was chosen and the latest is another: ``--version latest`` reads that
    latest_differs: bool = False


def choose_version(path: str | os.PathLike[str], version: str | None = None) -> ChosenVersion:
    """The version of the checkpoint at ``path`` to read.

    ``version``: "latest" (the last committed version), "best" (early stopping's, an error when
    there is none) or None: "best" when early stopping kept one, else "latest". Only None can
    give a note; it names the best version, its validation metric and the latest version.
    """
    if version is not None:
        return ChosenVersion(checkpoint_dir(path, version))
    store = CheckpointStore(path)
    best = store.read_best()
    if best is None:
        return ChosenVersion(Path(path))
    latest = store.committed_version()
    chosen = int(best["version"])
    if latest and chosen > latest:  # best/ of an earlier run than the committed one
        return ChosenVersion(
            Path(path),
            f"{path}: using the latest version {latest}; best/ holds version {chosen}, beyond "
            "it (left from an earlier run?)",
        )
    if latest and _other_import(store, chosen, latest):
        return ChosenVersion(
            Path(path),
            f"{path}: using the latest version {latest}; best/ holds version {chosen}, trained "
            "on an earlier import of the entity store (before it grew)",
        )
    metric = describe_best(best)
    if chosen == latest:
        return ChosenVersion(
            store.path / BEST_DIR,
            f"{path}: using version {chosen}, the latest and the best kept by early stopping "
            f"({metric})",
        )
    return ChosenVersion(
        store.path / BEST_DIR,
        f"{path}: using version {chosen}, the best kept by early stopping ({metric}); the "
        f"latest is version {latest}",
        latest_differs=True,
    )


def _other_import(store: CheckpointStore, best: int, latest: int) -> bool:
    """Whether ``best/`` was trained on another import than the latest version (a model grown
    since, see docs/growing.md): its rows no longer match the entity store."""
    try:
        kept = CheckpointStore(store.path / BEST_DIR).read_metadata(best).import_id
        now = store.read_metadata(latest).import_id
    except CheckpointError:
        return False  # the reader reports what is wrong with the files
    return kept is not None and now is not None and kept != now


def describe_best(best: dict[str, Any]) -> str:
    """``validation mrr 0.4123`` from a ``best.json`` record (what is there of it)."""
    metric, value = best.get("metric"), best.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"validation {metric or 'metric'} {float(value):.4f}"
    return "validation metric unknown"
