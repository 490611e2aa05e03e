"""The on-disk layout of a checkpoint directory: which names are bigembed's, and reading a
``.npy`` header. :class:`~bigembed.checkpoints.store.CheckpointStore` is the one owner of a
checkpoint directory; the helpers here are its parts.

Layout of ``checkpoint_path`` (documented in docs/FORMAT.md):

``checkpoint_version.txt``
    The committed version N: the number of completed (epoch, edge path, edge chunk) steps.
    Written last, atomically: it is the commit point. Missing means "no checkpoint".
``embeddings_{type}_{part}.v{N}.npy`` / ``optimizer_{type}_{part}.v{N}.npy``
    One partition's float32 embeddings ``(count, dim)`` and row-Adagrad state ``(count,)``.
``model.v{N}.pt``
    Relation operator parameters, global embeddings and their Adagrad state (``torch.save``).
``metadata.v{N}.json``
    A :class:`~bigembed.checkpoints.metadata.CheckpointMetadata` record (format version,
    config, iteration position, entity counts, relations, import id, timestamp).
``training_stats.json``
    JSON lines, one per trained bucket and per completed step, each tagged with its version.
``config.json``, ``validation_stats.json``
    The run's config; early stopping's evaluations (JSON lines).
``epoch_{E}/``, ``best/``
    Snapshots kept by ``checkpoint_preservation_interval`` and by early stopping (hard links to
    that version's files; ``best/best.json`` says which version).
``index/v{N}/{type}.faiss`` / ``{type}.json``
    Approximate-nearest-neighbour indexes built by ``bigembed index`` from version N (see
    :mod:`bigembed.serving.ann_files`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bigembed.errors import CheckpointError

VERSION_FILE = "checkpoint_version.txt"
STATS_FILE = "training_stats.json"
CONFIG_FILE = "config.json"
VALIDATION_FILE = "validation_stats.json"  # early stopping's evaluations, JSON lines
BEST_DIR = "best"  # the best version so far: a snapshot (hard links) like epoch_N/
BEST_FILE = "best.json"  # in BEST_DIR: which version, its metric; proves the snapshot is ours
# Present only while a run that started from an empty directory has not committed its first
# version: it proves that the version-1 files next to it were written by bigembed.
FRESH_MARKER = ".first_version_in_progress"
VERSIONED = re.compile(r"^(?P<stem>.+)\.v(?P<version>\d+)\.(?P<ext>npy|pt|json)$")
# Temporary names bigembed itself creates: atomic_file / atomic_write_bytes (mkstemp adds
# ".XXXXXXXX"), link_partition's copy fallback (".NAME.tmp"), preserve's ".epoch_E.tmp/".
TMP_FILE = re.compile(r"^\.(?P<name>.+?)(?:\.[a-z0-9_]{8})?\.tmp$")
TMP_SNAPSHOT = re.compile(r"^\.(?:epoch_\d+|best)(?:\.old)?\.tmp$")
INDEX_DIR = "index"  # bigembed index's FAISS indexes, one v{N}/ per checkpoint version
# v{N}/, or atomic_directory's temporaries of it (".v{N}.XXXXXXXX.tmp" / ".old")
INDEX_VERSION_DIR = re.compile(r"^(?:v\d+|\.v\d+\.[a-z0-9_]+\.(?:tmp|old))$")
INDEX_FILE = re.compile(r"^[^/]+\.(?:faiss|json)$")
OWN_NAMES = {VERSION_FILE, STATS_FILE, CONFIG_FILE, FRESH_MARKER, VALIDATION_FILE, BEST_FILE}


def is_own_name(name: str) -> bool:
    """A file name bigembed writes in a checkpoint directory."""
    return name in OWN_NAMES or VERSIONED.match(name) is not None


def is_own_index(path: Path) -> bool:
    """``index/`` holding only what ``bigembed index`` writes: ``v{N}/`` folders (or their
    temporaries) of ``.faiss`` and ``.json`` files."""
    if path.name != INDEX_DIR or not path.is_dir() or path.is_symlink():
        return False
    for sub in path.iterdir():
        if not (INDEX_VERSION_DIR.match(sub.name) and sub.is_dir() and not sub.is_symlink()):
            return False
        if not all(INDEX_FILE.match(f.name) and f.is_file() for f in sub.iterdir()):
            return False
    return True


def is_own_temporary(name: str) -> bool:
    """A temporary name bigembed creates for one of its own files."""
    m = TMP_FILE.match(name)
    return m is not None and is_own_name(m.group("name"))


def version_of(name: str) -> int | None:
    """The version of a versioned file name (``model.v3.pt``: 3), None for other names."""
    m = VERSIONED.match(name)
    return int(m.group("version")) if m else None


def version_files(directory: Path, version: int) -> list[Path]:
    """The files of ``version`` in ``directory``."""
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if version_of(p.name) == version]


def versions_in(directory: Path) -> list[int]:
    """Every version that has at least one file in ``directory``, ascending."""
    if not directory.is_dir():
        return []
    return sorted({v for p in directory.iterdir() if (v := version_of(p.name)) is not None})


def remove_temporaries(directory: Path) -> int:
    """Delete temporary files and snapshot directories of an interrupted write or snapshot;
    returns how many.

    Only names bigembed creates are touched; a snapshot directory holding anything else is
    refused rather than deleted.
    """
    removed = 0
    for p in directory.iterdir():
        if TMP_SNAPSHOT.match(p.name) and p.is_dir() and not p.is_symlink():
            foreign = [
                c.name for c in p.iterdir() if not (is_own_name(c.name) or is_own_temporary(c.name))
            ]
            if foreign:
                raise CheckpointError(
                    f"{p}: left by an interrupted snapshot but holds {foreign[0]!r}, which "
                    "bigembed did not write; move it away"
                )
            shutil.rmtree(p)
            removed += 1
        elif is_own_temporary(p.name) and p.is_file():
            p.unlink()
            removed += 1
    return removed


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file from its header alone (nothing else is read)."""
    try:
        with open(path, "rb") as f:
            major, _minor = np.lib.format.read_magic(f)
            if major == 1:
                shape, _order, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _order, dtype = np.lib.format.read_array_header_2_0(f)
            size = os.fstat(f.fileno()).st_size
            data_start = f.tell()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (incomplete checkpoint?)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable .npy file ({exc})") from None
    need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if size - data_start < need:
        raise CheckpointError(
            f"{path}: truncated: its header promises shape {tuple(shape)} ({need:,} bytes) but "
            f"the file holds {size - data_start:,} bytes of data"
        )
    return tuple(int(d) for d in shape), dtype


def map_npy(f: BinaryIO, path: Path, *, writable: bool = False) -> np.ndarray:
    """Memory-map the ``.npy`` file open as ``f`` (``path`` names it in errors): read-only, or
    copy-on-write when ``writable``. Mapping an open file rather than a name keeps a reader on
    the version it opened even when a training's commit has since removed the name."""
    try:
        f.seek(0)
        major, _minor = np.lib.format.read_magic(f)
        read_header = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(f)
        return np.memmap(
            f, dtype, "c" if writable else "r", f.tell(), shape, "F" if fortran else "C"
        )
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable embeddings ({exc})") from None


def write_error(path: Path, exc: OSError) -> CheckpointError:
    """A failed write of ``path`` as one line; a full disk says the last commit is intact."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        why += " (free some space; the last committed checkpoint is intact and training resumes "
        why += "from it)"
    return CheckpointError(f"{path}: cannot write: {why}")
