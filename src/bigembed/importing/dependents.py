"""Before ``import --force`` replaces an entity store: the checkpoints that would lose it.

Training records every checkpoint trained on a store
(:func:`bigembed.storage.record_dependent`). Once the new import is staged, its import id is
known (:func:`bigembed.storage.content_import_id`); :func:`check_replacement` compares it with
the store's. The same id means the same entity ids, and every checkpoint stays usable. Another
id orphans the checkpoints whose committed version records the old one: the import is refused
before anything is published, unless ``--allow-orphans``, in which case the old store's names
are kept in ``previous_imports/{old import id}/`` inside the entity path (hard links: no copy),
where ``bigembed remap`` finds them to match the model's rows to the new names. A store from
before content-derived ids (a random id) keeps that id when the new import has the same
entities (:func:`restamp`), so the checkpoints recording it stay usable; otherwise its names are
kept whenever it is replaced, since it has no complete record of its checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

from bigembed.atomic import DIR_MODE, fsync_dir
from bigembed.checkpoints import CheckpointStore
from bigembed.errors import BigembedError, OutputExistsError
from bigembed.importing.publish import OWN_ENTITY_PATTERNS, Publisher
from bigembed.storage import (
    IMPORT_ID,
    MANIFEST,
    EntityStore,
    content_import_id,
    has_manifest,
    is_legacy_import_id,
    previous_import_path,
    read_dependents,
)

SHOWN = 3  # checkpoints named in a message

logger = logging.getLogger(__name__)


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


def _content_id(store: EntityStore) -> str:
    """The content-derived id of an existing store (whatever id its manifest records)."""
    names = {
        t: [store.names_array(t, p) for p in range(store.num_partitions(t))]
        for t in store.entity_types
    }
    return content_import_id(names, store.relation_names(), store.dynamic_relations)


def restamp(publisher: Publisher, import_id: str) -> None:
    """Record ``import_id`` instead of the computed one in the staged manifests."""
    assert publisher.work is not None
    for directory in [publisher.work / "entities", *publisher.edge_staging]:
        path = directory / MANIFEST
        data = json.loads(path.read_text(encoding="utf-8"))
        data[IMPORT_ID] = import_id
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def check_replacement(
    entity_path: Path, new_id: str, *, allow_orphans: bool, extends: Collection[str] = ()
) -> str:
    """The import id to publish over the entity store at ``entity_path`` for a new import of id
    ``new_id``; refuses when a checkpoint trained on the store would be orphaned (see the
    module docstring).

    A store from before content-derived ids whose entities equal the new import's keeps its
    (random) id, so the checkpoints that record it stay usable. A new import that ``extends``
    the store's import (``import --extend``) orphans nothing: its checkpoints are prefixes of it.
    """
    if not has_manifest(entity_path):
        return new_id
    try:
        old = EntityStore(entity_path)
    except BigembedError:
        return new_id  # an interrupted or damaged store: no model can use it as it is
    if old.import_id is None:
        return new_id
    deps = live_dependents(entity_path, old.import_id)
    if old.import_id == new_id:
        if deps:
            logger.info(
                "same entities as before: the %d checkpoint(s) trained on %s stay usable",
                len(deps),
                entity_path,
            )
        return new_id
    if old.import_id in extends:
        if deps:
            logger.info(
                "extending %s: the %d checkpoint(s) trained on it grow to the new entities "
                "when `bigembed train` continues them",
                entity_path,
                len(deps),
            )
        return new_id
    legacy = is_legacy_import_id(old.import_id)
    if legacy and _content_id(old) == new_id:
        logger.info("same entities as before: %s keeps its import id", entity_path)
        return old.import_id
    if deps and not allow_orphans:
        raise OutputExistsError(
            f"{entity_path}: {len(deps)} checkpoint(s) were trained on this entity store "
            f"({_shown(deps)}) and this import changes its entities; nothing was replaced: "
            "import the same data to keep them, import into another entity_path, or pass "
            "--allow-orphans (then `bigembed remap CHECKPOINT` matches a model to the new names)"
        )
    if deps or legacy:  # a legacy store has no complete record of its checkpoints
        kept = keep_previous_names(old)
        logger.warning(
            "replacing the entity store of %s; its names are kept in %s: run `bigembed remap "
            "CHECKPOINT` to match a model trained on it to the new import",
            f"{len(deps)} checkpoint(s) ({_shown(deps)})" if deps else "an older import",
            kept,
        )
    return new_id
