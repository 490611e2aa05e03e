"""Before ``import --force`` replaces an entity store: the checkpoints that would lose it.

Training records every checkpoint trained on a store
(:func:`bigembed.storage.record_dependent`). Once the new import is staged, its import id is
known (:func:`bigembed.storage.content_import_id`); :func:`check_replacement` compares it with
the store's. The same id means the same entity ids, and every checkpoint stays usable. Another
id orphans the checkpoints whose committed version records the old one: the import is refused
before anything is published, unless ``--allow-orphans``, in which case the old store's names
are kept in ``previous_imports/{old import id}/`` inside the entity path (hard links: no copy),
where ``bigembed remap`` finds them to match the model's rows to the new names.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from bigembed.atomic import DIR_MODE, fsync_dir
from bigembed.checkpoints import CheckpointStore
from bigembed.errors import BigembedError, OutputExistsError
from bigembed.importing.publish import OWN_ENTITY_PATTERNS
from bigembed.storage import EntityStore, has_manifest, read_dependents

PREVIOUS_IMPORTS = "previous_imports"  # in the entity path: names of replaced imports
SHOWN = 3  # checkpoints named in a message

logger = logging.getLogger(__name__)


def previous_import_path(entity_path: str | os.PathLike[str], import_id: str) -> Path:
    """Where ``import --force --allow-orphans`` keeps the names of the import ``import_id``."""
    return Path(entity_path) / PREVIOUS_IMPORTS / import_id


def live_dependents(entity_path: Path, import_id: str) -> list[Path]:
    """The recorded checkpoints trained on this store that still exist and whose committed
    version records ``import_id`` (a checkpoint already orphaned or retrained elsewhere is not
    one)."""
    here = os.path.realpath(entity_path)
    found = []
    for dep in read_dependents(entity_path):
        if os.path.realpath(dep.entity_path) != here:
            continue  # recorded by the store this one was copied from
        store = CheckpointStore(dep.checkpoint)
        try:
            if store.committed_version() <= 0:
                continue
            recorded = store.read_metadata().import_id
        except (BigembedError, OSError):
            continue
        if recorded == import_id and dep.checkpoint not in found:
            found.append(dep.checkpoint)
    return found


def _shown(paths: list[Path]) -> str:
    names = ", ".join(str(p) for p in paths[:SHOWN])
    return names + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def keep_previous_names(store: EntityStore) -> Path:
    """Link the store's own files into ``previous_imports/{import id}/`` (built under a
    temporary name, renamed when complete); returns that directory."""
    assert store.import_id is not None
    final = previous_import_path(store.path, store.import_id)
    if (final / "manifest.json").exists():
        return final
    final.parent.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        os.chmod(tmp, DIR_MODE)
        for pattern in OWN_ENTITY_PATTERNS:
            for src in store.path.glob(pattern):
                if src.is_file():
                    try:
                        os.link(src, tmp / src.name)
                    except OSError:
                        shutil.copy2(src, tmp / src.name)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def check_replacement(entity_path: Path, new_id: str, *, allow_orphans: bool) -> None:
    """Refuse to replace the entity store at ``entity_path`` with the import ``new_id`` when a
    checkpoint trained on it would be orphaned (see the module docstring)."""
    if not has_manifest(entity_path):
        return
    try:
        old = EntityStore(entity_path)
    except BigembedError:
        return  # an interrupted or damaged store: no model can use it as it is
    if old.import_id is None:
        return
    deps = live_dependents(entity_path, old.import_id)
    if not deps:
        return
    if old.import_id == new_id:
        logger.info(
            "same entities as before (import id %s): the %d checkpoint(s) trained on %s stay "
            "usable",
            new_id,
            len(deps),
            entity_path,
        )
        return
    if not allow_orphans:
        raise OutputExistsError(
            f"{entity_path}: {len(deps)} checkpoint(s) were trained on this entity store "
            f"({_shown(deps)}) and this import changes its entities; nothing was replaced: "
            "import the same data to keep them, import into another entity_path, or pass "
            "--allow-orphans (then `bigembed remap CHECKPOINT` matches a model to the new names)"
        )
    kept = keep_previous_names(old)
    logger.warning(
        "replacing the entity store of %d checkpoint(s) (%s); their names are kept in %s: run "
        "`bigembed remap CHECKPOINT` to match a model to the new import",
        len(deps),
        _shown(deps),
        kept,
    )
