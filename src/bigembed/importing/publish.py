"""Build the import's outputs in temporary places and publish them only when all are done.

* each edge store is built as ``store/`` inside a hidden sibling staging directory of its edge
  path and renamed into place;
* the entity files are built in a hidden work directory inside ``entity_path`` and moved in
  one by one (the entity path may already hold other files: PBG's examples keep the raw data
  there, and edge paths often live inside it).

Publication order, so that a kill at any point leaves a state readers detect:

1. ``entity_path/manifest.json`` is replaced by a *publishing* manifest (right ``format``, key
   ``publishing``): readers refuse the store ("an import was interrupted"), ``--force`` may
   still replace it;
2. the edge stores are swapped in (their manifests carry the new ``import_id``);
3. the entity files are swapped in;
4. the new manifest replaces the publishing one: the commit point.

Every staging directory carries a locked marker naming its owner
(:func:`bigembed.output_paths.claim_staging`); a later import removes those left by a dead run.
``--force`` replaces only bigembed's own stores (an edge store's or entity store's manifest
with the right format), moving them aside and deleting them only after everything is in
place. On failure everything new is removed and everything moved aside is put back,
including any directory this import created.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from bigembed.atomic import DIR_MODE, fsync_dir, fsync_file, fsync_tree
from bigembed.errors import OutputExistsError
from bigembed.output_paths import (
    OutputError,
    StagingClaim,
    check_replaceable,
    claim_staging,
    remove_dead_staging,
    store_format,
)
from bigembed.storage import (
    DYNAMIC_REL_COUNT,
    DYNAMIC_REL_NAMES,
    ENTITY_FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PUBLISHING_KEY,
    entity_count_file,
    entity_names_file,
)

# Files that make a directory look like an entity store (PBG's JSON names included).
ENTITY_PATTERNS = (
    MANIFEST,
    "entity_count_*.txt",
    "entity_names_*.parquet",
    "entity_names_*.json",
    "entity_features_*.npz",
    "feature_names_*.parquet",
    DYNAMIC_REL_COUNT,
    DYNAMIC_REL_NAMES,
)
# The ones bigembed writes, hence may replace (never PBG's entity_names_*.json).
OWN_ENTITY_PATTERNS = tuple(p for p in ENTITY_PATTERNS if p != "entity_names_*.json")
WORK_PREFIX = ".bigembed-import-"
STORE = "store"  # the edge store inside its staging (or set-aside) directory


def staging_prefix(edge_path: Path) -> str:
    return f".{edge_path.name}.import-"


def aside_prefix(edge_path: Path) -> str:
    return f".{edge_path.name}.old-"


def _make_temp_dir(prefix: str, parent: Path) -> Path:
    """mkdtemp with the permissions of an ordinary mkdir (mkdtemp's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, DIR_MODE)
    return path


def _glob(path: Path, patterns: tuple[str, ...]) -> list[Path]:
    if not path.is_dir():
        return []
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in path.glob(pattern) if p.is_file())
    return sorted(found)


def existing_entity_files(path: Path) -> list[Path]:
    """Files in ``path`` that look like an entity store's (bigembed's or PBG's)."""
    return _glob(path, ENTITY_PATTERNS)


def planned_entity_files(partitions: Mapping[str, int]) -> list[str]:
    """Names of the files an import writes into the entity path, for the overlap check."""
    names = [MANIFEST, DYNAMIC_REL_COUNT, DYNAMIC_REL_NAMES]
    for etype, parts in partitions.items():
        for part in range(parts):
            names += [entity_count_file(etype, part), entity_names_file(etype, part)]
    return names


class Publisher:
    """Owns every temporary path of one import; :meth:`abort` leaves no trace."""

    def __init__(self, entity_path: Path, edge_paths: list[Path], *, force: bool) -> None:
        self.entity_path = entity_path
        self.edge_paths = edge_paths
        self.force = force
        self._created_dirs: list[Path] = []
        self.work: Path | None = None  # hidden dir inside entity_path: entity files + spill
        self.edge_staging: list[Path] = []  # where each edge store is built
        self._staging_roots: list[Path] = []
        self._claims: list[StagingClaim] = []
        self._undo: list[Callable[[], None]] = []  # reverses the publication so far
        self._trash: list[Path] = []

    # ---- checks
    def _check_entity_path(self, *, during: bool) -> list[Path]:
        """The entity files to replace; refuse an entity path that is not ours to replace."""
        path = self.entity_path
        if (path.is_symlink() and not path.exists()) or (path.exists() and not path.is_dir()):
            raise OutputError(f"{path}: entity_path exists and is not a directory")
        found = existing_entity_files(path)
        if not found:
            return []
        if not self.force:
            if during:
                raise OutputExistsError(f"{path}: an entity store appeared during the import")
            raise OutputExistsError(
                f"{path}: already holds an entity store ({found[0].name}); "
                f"pass --force to replace it"
            )
        if store_format(path) != ENTITY_FORMAT:
            raise OutputError(
                f"{path}: holds entity files ({found[0].name}) but no bigembed entity store "
                f"{MANIFEST}: --force replaces only bigembed's own stores; remove them yourself "
                f"or choose another entity_path"
            )
        return _glob(path, OWN_ENTITY_PATTERNS)

    def _check_edge_path(self, path: Path, *, during: bool) -> bool:
        """Whether ``path`` holds something to replace; refuse what is not ours."""
        if not (path.exists() or path.is_symlink()):
            return False
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            return False  # an empty directory: nothing to lose
        if not self.force:
            if during:
                raise OutputExistsError(f"{path}: appeared during the import")
            raise OutputExistsError(f"{path}: edge path already exists; pass --force to replace it")
        return check_replaceable(path, "edge store", force=True)

    def check(self) -> None:
        """Refuse existing outputs unless forced and ours (run before any work)."""
        self._check_entity_path(during=False)
        for path in self.edge_paths:
            self._check_edge_path(path, during=False)

    # ---- staging
    def _mkdirs(self, path: Path) -> None:
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir()
            self._created_dirs.append(d)

    def _new_staging(self, prefix: str, parent: Path) -> Path:
        root = _make_temp_dir(prefix, parent)
        try:
            self._claims.append(claim_staging(root))
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return root

    def begin(self) -> Path:
        """Clean up after dead runs, create the staging directories; returns the work dir."""
        self._mkdirs(self.entity_path)
        remove_dead_staging(self.entity_path, [WORK_PREFIX])
        for path in self.edge_paths:
            self._mkdirs(path.parent)
            remove_dead_staging(path.parent, [staging_prefix(path), aside_prefix(path)])
        self.work = self._new_staging(WORK_PREFIX, self.entity_path)
        (self.work / "entities").mkdir()
        (self.work / "spill").mkdir()
        for path in self.edge_paths:
            root = self._new_staging(staging_prefix(path), path.parent)
            self._staging_roots.append(root)
            (root / STORE).mkdir()
            self.edge_staging.append(root / STORE)
        return self.work

    # ---- publishing
    def _move(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)
        self._undo.append(lambda: os.replace(dst, src))

    def _set_aside(self, path: Path) -> None:
        root = self._new_staging(aside_prefix(path), path.parent)
        self._trash.append(root)
        self._move(path, root / STORE)

    def _mark_publishing(self, import_id: str) -> None:
        """Step 1: the entity store reads as "interrupted" until the new manifest is in."""
        assert self.work is not None
        target = self.entity_path / MANIFEST
        marker = self.work / "publishing.json"
        data = {"format": ENTITY_FORMAT, "format_version": FORMAT_VERSION}
        data[PUBLISHING_KEY] = import_id
        marker.write_text(json.dumps(data) + "\n", encoding="utf-8")
        fsync_file(marker)
        saved: Path | None = None
        if target.exists():
            saved = self.work / "replaced-manifest.json"
            shutil.copy2(target, saved)
        os.replace(marker, target)
        fsync_dir(self.entity_path)

        def undo() -> None:
            if saved is not None:
                os.replace(saved, target)
            else:
                target.unlink(missing_ok=True)

        self._undo.append(undo)

    def publish(self, import_id: str) -> None:
        """Swap the new stores in (see the module docstring for the order)."""
        assert self.work is not None
        entities = self.work / "entities"
        shutil.rmtree(self.work / "spill", ignore_errors=True)
        for staging in self.edge_staging:
            fsync_tree(staging)
        fsync_tree(entities)
        try:
            replace_edges = [self._check_edge_path(p, during=True) for p in self.edge_paths]
            old = self._check_entity_path(during=True)
            self._mark_publishing(import_id)
            for staging, final, replace in zip(
                self.edge_staging, self.edge_paths, replace_edges, strict=True
            ):
                if replace:
                    self._set_aside(final)
                elif final.is_dir():
                    final.rmdir()  # empty
                    self._undo.append(final.mkdir)
                self._move(staging, final)
                fsync_dir(final.parent)
            backup = self.work / "replaced"
            backup.mkdir()
            for path in old:
                if path.name != MANIFEST:
                    self._move(path, backup / path.name)
            for path in sorted(entities.iterdir()):
                if path.name != MANIFEST:
                    self._move(path, self.entity_path / path.name)
            fsync_dir(self.entity_path)
            self._move(entities / MANIFEST, self.entity_path / MANIFEST)  # the commit point
            fsync_dir(self.entity_path)
        except BaseException:
            self._rollback()
            raise
        self._undo.clear()
        for path in self._trash:
            shutil.rmtree(path, ignore_errors=True)
        for root in self._staging_roots:
            shutil.rmtree(root, ignore_errors=True)  # now only its marker
        shutil.rmtree(self.work, ignore_errors=True)
        self._release()
        self._created_dirs.clear()

    def _rollback(self) -> None:
        for undo in reversed(self._undo):
            with contextlib.suppress(OSError):
                undo()
        self._undo.clear()

    def _release(self) -> None:
        for claim in self._claims:
            claim.release()
        self._claims.clear()

    def abort(self) -> None:
        """Remove every trace of this import (safe to call more than once)."""
        self._rollback()
        for root in self._staging_roots:
            shutil.rmtree(root, ignore_errors=True)
        for root in self._trash:
            if not (root / STORE).exists():  # never a store the rollback could not put back
                shutil.rmtree(root, ignore_errors=True)
        self._staging_roots.clear()
        self._trash.clear()
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        self._release()
        for d in reversed(self._created_dirs):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if still empty
        self._created_dirs.clear()
