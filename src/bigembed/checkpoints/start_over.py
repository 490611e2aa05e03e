"""``bigembed train --fresh``: start over in a checkpoint directory, deleting only what bigembed
provably wrote there.

A directory is provably a bigembed checkpoint when its version file names a committed version
whose metadata record validates, when it holds the first version of a run in progress
(:data:`~bigembed.checkpoints.layout.FRESH_MARKER`), or when an earlier start-over was
interrupted (:data:`START_OVER_MARKER`, written before anything is deleted and removed last, so
that a start-over killed half-way can be run again). Only bigembed's own names are deleted:
versioned files, the version file, the stats, config and validation logs, bigembed's
temporaries, and the ``epoch_N/`` and ``best/`` snapshots and the ``index/`` of
``bigembed index`` when they hold nothing else. Any
other file is left where it is (and named in the log).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from bigembed.atomic import atomic_write_text, fsync_dir
from bigembed.checkpoints.layout import (
    BEST_DIR,
    FRESH_MARKER,
    VERSION_FILE,
    is_own_index,
    is_own_name,
    is_own_temporary,
    remove_temporaries,
    write_error,
)
from bigembed.checkpoints.store import CheckpointStore
from bigembed.errors import CheckpointError

logger = logging.getLogger(__name__)

#: Present only while a start-over deletes a checkpoint: proves the rest is still bigembed's.
START_OVER_MARKER = ".start_over_in_progress"
SNAPSHOT = re.compile(rf"^(?:epoch_\d+|{BEST_DIR})$")


def _proven(store: CheckpointStore) -> bool:
    path = store.path
    if (path / START_OVER_MARKER).exists() or (path / FRESH_MARKER).exists():
        return True
    try:
        version = store.committed_version()
        return version > 0 and store.read_metadata(version) is not None
    except CheckpointError:
        return False


def _own_file(p: Path) -> bool:
    return p.is_file() and (is_own_name(p.name) or is_own_temporary(p.name))


def _own_snapshot(p: Path) -> bool:
    """``epoch_N/`` or ``best/`` holding only bigembed's files."""
    ok = SNAPSHOT.match(p.name) is not None and p.is_dir() and not p.is_symlink()
    return ok and all(_own_file(c) for c in p.iterdir())


def start_over(path: str | Path) -> int:
    """Delete the checkpoint in ``path`` so that training starts from nothing; returns how many
    files and snapshots were removed (0: there was no checkpoint).

    Refuses (CheckpointError, nothing deleted) when ``path`` holds files with bigembed's names
    but is not provably a bigembed checkpoint.
    """
    store = CheckpointStore(path)
    directory = store.path
    if not directory.exists():
        return 0
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (checkpoint_path)")
    own = [
        p
        for p in directory.iterdir()
        if (p.is_file() and (is_own_name(p.name) or p.name == START_OVER_MARKER))
        or _own_snapshot(p)
        or is_own_index(p)
    ]
    if not own and not any(is_own_temporary(p.name) for p in directory.iterdir()):
        return 0
    if not _proven(store):
        raise CheckpointError(
            f"{directory}: holds files named like a checkpoint's but no committed version with "
            "readable metadata; --fresh deletes only a checkpoint it can prove bigembed wrote: "
            "delete it yourself or set another checkpoint_path"
        )
    marker = directory / START_OVER_MARKER
    try:
        atomic_write_text(marker, "a checkpoint being deleted by bigembed train --fresh\n")
        removed = remove_temporaries(directory)
        # the version file first: from here on nothing counts as committed
        ordered = sorted(own, key=lambda p: (p.name != VERSION_FILE, p.name))
        for p in ordered:
            if p == marker:
                continue
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
            removed += 1
        marker.unlink()
        fsync_dir(directory)
    except OSError as exc:
        raise write_error(directory, exc) from None
    kept = sorted(p.name for p in directory.iterdir())
    if kept:
        logger.warning(
            "--fresh: kept %d file(s) bigembed did not write in %s: %s",
            len(kept),
            directory,
            ", ".join(kept[:5]),
        )
    logger.info("--fresh: deleted the checkpoint in %s (%d entries)", directory, removed)
    return removed
