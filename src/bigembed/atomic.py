"""Atomic file and directory publication: write under a temporary name, fsync, rename.

Readers never see a half-written file: either the old content or the new, complete one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bigembed.errors import OutputExistsError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import (in the main thread): os.umask can only be read by setting it, which
# would race with threads creating files.
UMASK = _read_umask()
FILE_MODE = 0o666 & ~UMASK  # what open() would give a new file
DIR_MODE = 0o777 & ~UMASK  # what mkdir() would give a new directory


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry (a rename or a new file in it) to stable storage."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temporary name in the same dir, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp makes 0600 files; outputs get ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it over ``path``.

    Use for writers that want a file name (numpy, pyarrow). On error the temporary is removed.
    """
    del mode
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        fsync_file(tmp_path)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    fsync_dir(path.parent)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync an existing file by name."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every file and directory below ``root`` (before publishing it with a rename)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


@contextlib.contextmanager
def atomic_directory(
    final: str | os.PathLike[str], *, force: bool = False, marker: str | None = None
) -> Iterator[Path]:
    """Build a directory under a temporary name and publish it at ``final`` only on success.

    With ``marker`` (an output kind of :mod:`bigembed.output_paths`) the new directory is
    written with bigembed's marker file, and ``force`` replaces an existing ``final`` only if
    it carries the same marker (checked again just before the swap). Without ``marker``,
    ``force`` replaces whatever is there: callers that take user paths pass a marker.
    The replaced directory is moved aside, then removed after the new one is in place. On any
    error the temporary directory is removed and ``final`` is left as it was.
    """
    from bigembed.output_paths import check_replaceable, write_marker

    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        os.chmod(tmp, DIR_MODE)  # mkdtemp makes 0700 directories
        if marker is not None:
            write_marker(tmp, marker)
        yield tmp
        fsync_tree(tmp)
        old = None
        if final.exists() or final.is_symlink():
            if not force:
                raise OutputExistsError(f"{final}: already exists; pass --force to replace it")
            if marker is not None:
                check_replaceable(final, marker, force=True)
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.rmdir(old)
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
