"""Which checkpoints were trained on an entity store: ``trained_checkpoints.json`` in it.

A checkpoint's embedding rows are the store's entity offsets, so replacing the store with
another import orphans the models trained on it. Training records its checkpoint here
(:func:`record_dependent`, written atomically; the file is bigembed's and survives
``import --force``, which replaces only the store's own files), and ``import --force`` reads it
back (:func:`read_dependents`) to refuse replacing a store that a live checkpoint still uses;
when it replaces one anyway, it keeps the old names in :func:`previous_import_path`.
Each entry names the checkpoint directory and the entity path it was trained on (both
absolute), so a copied store does not claim the checkpoints of its original.

The record is advisory: a store on a read-only disk, or a lost update when two trainings start
at the same instant, costs the warning, never the training.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from bigembed.atomic import atomic_write_text

DEPENDENTS_FILE = "trained_checkpoints.json"
PREVIOUS_IMPORTS = "previous_imports"  # in the entity path: names of replaced imports
DEPENDENTS_FORMAT = "bigembed-trained-checkpoints"
_ATTEMPTS = 3  # re-reads after writing: another training's concurrent update is merged

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dependent:
    """One checkpoint directory trained on the entity store at ``entity_path``."""

    checkpoint: Path
    entity_path: Path


def previous_import_path(entity_path: str | os.PathLike[str], import_id: str) -> Path:
    """Where ``import --force`` keeps the names of the replaced import ``import_id`` (for
    ``bigembed remap``)."""
    return Path(entity_path) / PREVIOUS_IMPORTS / import_id


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path))


def read_dependents(entity_path: str | os.PathLike[str]) -> list[Dependent]:
    """The recorded checkpoints of the store at ``entity_path`` (none when the file is missing
    or unreadable: the record is advisory)."""
    path = Path(entity_path) / DEPENDENTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["checkpoints"] if data.get("format") == DEPENDENTS_FORMAT else []
        return [Dependent(Path(e["checkpoint"]), Path(e["entity_path"])) for e in entries]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("%s: unreadable, ignored (%s)", path, exc)
        return []


def _write(path: Path, entries: list[Dependent]) -> None:
    data = {
        "format": DEPENDENTS_FORMAT,
        "checkpoints": [
            {"checkpoint": str(e.checkpoint), "entity_path": str(e.entity_path)} for e in entries
        ],
    }
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def record_dependent(
    entity_path: str | os.PathLike[str], checkpoint: str | os.PathLike[str]
) -> None:
    """Add ``checkpoint`` to the store's record (nothing when it is there already).

    Entries whose checkpoint directory no longer exists are dropped on the way.
    """
    entry = Dependent(_absolute(checkpoint), _absolute(entity_path))
    path = Path(entity_path) / DEPENDENTS_FILE
    try:
        for _ in range(_ATTEMPTS):
            found = read_dependents(entity_path)
            if entry in found:
                return
            kept = [e for e in found if e.checkpoint.is_dir()]
            _write(path, [*kept, entry])
    except OSError as exc:
        logger.warning(
            "%s: cannot record that %s was trained on it (%s); `bigembed import --force` will "
            "not know that this checkpoint depends on it",
            path,
            checkpoint,
            exc.strerror or exc,
        )
        return
    if entry not in read_dependents(entity_path):
        logger.warning("%s: could not record %s (concurrent updates)", path, checkpoint)
