"""Build the import's outputs in temporary places and publish them only when all are done.

* each edge path is built as a hidden sibling directory and renamed into place;
* the entity files are built in a hidden directory inside ``entity_path`` and moved in one by
  one, ``manifest.json`` last (the entity path may already hold other files: PBG's examples
  keep the raw data there, and edge paths often live inside it).

``--force`` moves replaced outputs aside and deletes them only after everything is in place.
On failure everything new is removed and everything moved aside is put back, including any
directory this import created.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from bigembed.atomic import DIR_MODE, fsync_dir, fsync_tree
from bigembed.errors import OutputExistsError
from bigembed.graph.format import MANIFEST

ENTITY_PATTERNS = (
    MANIFEST,
    "entity_count_*.txt",
    "entity_names_*.parquet",
    "entity_names_*.json",
    "dynamic_rel_count.txt",
    "dynamic_rel_names.json",
)


def _make_temp_dir(prefix: str, parent: Path) -> Path:
    """mkdtemp with the permissions of an ordinary mkdir (mkdtemp's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, DIR_MODE)
    return path


def existing_entity_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    found: set[Path] = set()
    for pattern in ENTITY_PATTERNS:
        found.update(p for p in path.glob(pattern) if p.is_file())
    return sorted(found)


class Publisher:
    """Owns every temporary path of one import; :meth:`abort` leaves no trace."""

    def __init__(self, entity_path: Path, edge_paths: list[Path], *, force: bool) -> None:
        self.entity_path = entity_path
        self.edge_paths = edge_paths
        self.force = force
        self._created_dirs: list[Path] = []
        self.work: Path | None = None  # hidden dir inside entity_path: entity files + spill
        self.edge_staging: list[Path] = []
        self._undo: list[tuple[Path, Path]] = []  # (moved-to, moved-from) to reverse on failure
        self._published: list[Path] = []
        self._trash: list[Path] = []

    # ---- checks
    def check(self) -> None:
        """Refuse existing outputs unless forced (run before any work)."""
        if self.force:
            return
        old = existing_entity_files(self.entity_path)
        if old:
            raise OutputExistsError(
                f"{self.entity_path}: already holds an entity store ({old[0].name}); "
                f"pass --force to replace it"
            )
        for path in self.edge_paths:
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                raise OutputExistsError(
                    f"{path}: edge path already exists; pass --force to replace it"
                )

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

    def begin(self) -> Path:
        """Create the staging directories; returns the work dir (entity files, spill)."""
        self._mkdirs(self.entity_path)
        self.work = _make_temp_dir(".bigembed-import-", self.entity_path)
        (self.work / "entities").mkdir()
        (self.work / "spill").mkdir()
        for path in self.edge_paths:
            self._mkdirs(path.parent)
            staging = _make_temp_dir(f".{path.name}.import-", path.parent)
            self.edge_staging.append(staging)
        return self.work

    # ---- publishing
    def _move(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)
        self._undo.append((dst, src))

    def _set_aside(self, path: Path) -> None:
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.rmdir(aside)
        self._move(path, aside)
        self._trash.append(aside)

    def publish(self) -> None:
        assert self.work is not None
        entities = self.work / "entities"
        shutil.rmtree(self.work / "spill", ignore_errors=True)
        for staging in self.edge_staging:
            fsync_tree(staging)
        fsync_tree(entities)
        try:
            for staging, final in zip(self.edge_staging, self.edge_paths, strict=True):
                if final.is_symlink() or final.exists():
                    if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
                        final.rmdir()
                    else:
                        if not self.force:
                            raise OutputExistsError(f"{final}: appeared during the import")
                        self._set_aside(final)
                self._move(staging, final)
                self._published.append(final)
                fsync_dir(final.parent)
            old = existing_entity_files(self.entity_path)
            if old and not self.force:
                raise OutputExistsError(
                    f"{self.entity_path}: an entity store appeared during the import"
                )
            backup = self.work / "replaced"
            backup.mkdir()
            for path in old:
                self._move(path, backup / path.name)
            new = sorted(entities.iterdir(), key=lambda p: p.name == MANIFEST)
            for path in new:
                self._move(path, self.entity_path / path.name)
            fsync_dir(self.entity_path)
        except BaseException:
            self._rollback()
            raise
        for path in self._trash:
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self._created_dirs.clear()

    def _rollback(self) -> None:
        for dst, src in reversed(self._undo):
            with contextlib.suppress(OSError):
                os.replace(dst, src)
        self._undo.clear()

    def abort(self) -> None:
        """Remove every trace of this import (safe to call more than once)."""
        self._rollback()
        for staging in self.edge_staging:
            shutil.rmtree(staging, ignore_errors=True)
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        for d in reversed(self._created_dirs):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if still empty
        self._created_dirs.clear()
