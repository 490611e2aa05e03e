"""Snapshots of one checkpoint version: ``epoch_{E}/`` (``checkpoint_preservation_interval``)
and ``best/`` (early stopping's best version), each a checkpoint directory of its own made of
hard links, built aside and swapped in by renames so that a reader never sees half of one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from bigembed.atomic import atomic_write_text, fsync_dir
from bigembed.checkpoints.layout import (
    BEST_DIR,
    BEST_FILE,
    CONFIG_FILE,
    STATS_FILE,
    VERSION_FILE,
    remove_temporaries,
    version_files,
    write_error,
)
from bigembed.errors import CheckpointError


def make_snapshot(directory: Path, version: int, name: str, extra: dict[str, str]) -> Path:
    """``name/`` in ``directory``: a checkpoint directory of its own holding ``version`` (hard
    links), the config and stats, and the ``extra`` files; built aside and swapped in by
    renames."""
    snap = directory / name
    tmp = directory / f".{name}.tmp"
    old = directory / f".{name}.old.tmp"
    try:
        if tmp.exists() or old.exists():
            remove_temporaries(directory)
        tmp.mkdir(parents=True)
        for p in version_files(directory, version):
            os.link(p, tmp / p.name)
        atomic_write_text(tmp / VERSION_FILE, f"{version}\n")
        for own in (CONFIG_FILE, STATS_FILE):
            if (directory / own).exists():
                shutil.copyfile(directory / own, tmp / own)
        for extra_name, text in extra.items():
            atomic_write_text(tmp / extra_name, text)
        if snap.exists():
            os.replace(snap, old)
        os.replace(tmp, snap)
        fsync_dir(directory)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(snap, exc) from None
    return snap


def read_best_record(directory: Path) -> dict[str, Any] | None:
    """``best/best.json`` when ``best/`` is bigembed's snapshot of a version, else None."""
    path = directory / BEST_DIR / BEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    ours = isinstance(data, dict) and data.get("written_by") == "bigembed"
    if ours and isinstance(data.get("version"), int):
        return data
    return None


def snapshot_best(directory: Path, version: int, info: dict[str, Any]) -> Path:
    """Make ``version`` the kept best one (``best/``, hard links; ``info`` goes to
    ``best/best.json``). A ``best`` entry bigembed did not write is refused, not replaced."""
    snap = directory / BEST_DIR
    if (snap.exists() or snap.is_symlink()) and (
        snap.is_symlink() or not snap.is_dir() or read_best_record(directory) is None
    ):
        raise CheckpointError(
            f"{snap}: exists but is not bigembed's best-version snapshot (no {BEST_FILE}); "
            "refusing to replace it: move it away"
        )
    record = {"written_by": "bigembed", **info, "version": version}
    return make_snapshot(directory, version, BEST_DIR, {BEST_FILE: json.dumps(record, indent=1)})
