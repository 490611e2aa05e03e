"""Versioned, atomic checkpoints (DESIGN.md invariant 3): the one reader and writer of a
checkpoint directory.

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
``epoch_{E}/``
    Snapshots kept by ``checkpoint_preservation_interval`` (hard links to that version's files).

Protocol of a writer (training, conversion), with N the committed version:

1. :meth:`CheckpointStore.open_for_training` creates the directory if needed, *discards* what
   an interrupted step left (:meth:`~CheckpointStore.discard_uncommitted`: temporaries and the
   files of versions newer than N, only when provably bigembed's) and returns N.
2. The step writes version N+1 ("dirty"): :meth:`~CheckpointStore.save_partition` for partitions
   swapped out or resident, :meth:`~CheckpointStore.link_partition` for untouched ones,
   :meth:`~CheckpointStore.save_model`, :meth:`~CheckpointStore.write_metadata`, then
   :meth:`~CheckpointStore.append_stats`. Each file is written atomically, but nothing of N+1
   counts yet.
3. :meth:`CheckpointStore.commit` replaces the version file with N+1 (the commit point), then
   deletes the files of N; :meth:`~CheckpointStore.preserve` may then snapshot N+1.

A run killed before step 3 restarts from N and step 1 deletes every file newer than N, so it
never reads half a step. A reader calls :meth:`CheckpointStore.open_for_reading` (the committed
version, or a CheckpointError saying what is wrong), then :meth:`~CheckpointStore.read_metadata`
and the model and partition files of that version; :mod:`bigembed.checkpoints.reading` does
that for inference.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigembed.atomic import atomic_file, atomic_write_bytes, atomic_write_text, fsync_dir
from bigembed.checkpoints.metadata import CheckpointMetadata, partition_key_text
from bigembed.errors import CheckpointError

__all__ = [
    "BEST_DIR",
    "BEST_FILE",
    "CONFIG_FILE",
    "FRESH_MARKER",
    "STATS_FILE",
    "VALIDATION_FILE",
    "VERSION_FILE",
    "CheckpointStore",
    "npy_header",
]
VERSION_FILE = "checkpoint_version.txt"
STATS_FILE = "training_stats.json"
CONFIG_FILE = "config.json"
VALIDATION_FILE = "validation_stats.json"  # early stopping's evaluations, JSON lines
BEST_DIR = "best"  # the best version so far: a snapshot (hard links) like epoch_N/
BEST_FILE = "best.json"  # in BEST_DIR: which version, its metric; proves the snapshot is ours
# Present only while a run that started from an empty directory has not committed its first
# version: it proves that the version-1 files next to it were written by bigembed.
FRESH_MARKER = ".first_version_in_progress"
_VERSIONED = re.compile(r"^(?P<stem>.+)\.v(?P<version>\d+)\.(?P<ext>npy|pt|json)$")
# Temporary names bigembed itself creates: atomic_file / atomic_write_bytes (mkstemp adds
# ".XXXXXXXX"), link_partition's copy fallback (".NAME.tmp"), preserve's ".epoch_E.tmp/".
_TMP_FILE = re.compile(r"^\.(?P<name>.+?)(?:\.[a-z0-9_]{8})?\.tmp$")
_TMP_SNAPSHOT = re.compile(r"^\.(?:epoch_\d+|best)(?:\.old)?\.tmp$")
_OWN_NAMES = {VERSION_FILE, STATS_FILE, CONFIG_FILE, FRESH_MARKER, VALIDATION_FILE, BEST_FILE}

logger = logging.getLogger(__name__)


def _is_own_name(name: str) -> bool:
    """A file name bigembed writes in a checkpoint directory."""
    return name in _OWN_NAMES or _VERSIONED.match(name) is not None


def _is_own_temporary(name: str) -> bool:
    m = _TMP_FILE.match(name)
    return m is not None and _is_own_name(m.group("name"))


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


def _write_error(path: Path, exc: OSError) -> CheckpointError:
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        why += " (free some space; the last committed checkpoint is intact and training resumes "
        why += "from it)"
    return CheckpointError(f"{path}: cannot write: {why}")


class CheckpointStore:
    """Reads and writes one checkpoint directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._warned_stats = False

    # ------------------------------------------------------------------ versions
    def committed_version(self) -> int:
        """The committed version; 0 when the version file is missing, empty or "0".

        Whether such a 0 is safe (no trained files next to it) is :meth:`discard_uncommitted`'s
        and :meth:`open_for_reading`'s business. Unreadable content is a CheckpointError.
        """
        vfile = self.path / VERSION_FILE
        try:
            raw = vfile.read_bytes()
        except FileNotFoundError:
            return 0
        except IsADirectoryError:
            raise CheckpointError(f"{vfile}: is a directory, not a version file") from None
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CheckpointError(
                f"{vfile}: not a version number (binary content); " + self._recovery_hint()
            ) from None
        if not text:
            return 0
        if not text.isdigit():
            raise CheckpointError(
                f"{vfile}: not a version number: {text[:40]!r}; " + self._recovery_hint()
            )
        return int(text)

    def exists(self) -> bool:
        return self.committed_version() > 0

    def versions_found(self) -> list[int]:
        """Every version that has at least one file in the directory, ascending."""
        if not self.path.is_dir():
            return []
        found = set()
        for p in self.path.iterdir():
            m = _VERSIONED.match(p.name)
            if m:
                found.add(int(m.group("version")))
        return sorted(found)

    def _complete(self, version: int) -> bool:
        return self.metadata_path(version).exists() and self.model_path(version).exists()

    def _recovery_hint(self) -> str:
        versions = self.versions_found()
        if not versions:
            return "delete it to start training from scratch"
        described = ", ".join(
            f"{v}" + ("" if self._complete(v) else " (incomplete)") for v in versions
        )
        complete = [v for v in versions if self._complete(v)]
        newest = complete[-1] if complete else versions[-1]
        return (
            f"versions found: {described}; write the newest complete version number "
            f"(e.g. {newest}) into it to resume from that version"
        )

    def _unproven_files_error(self, committed_text: str) -> CheckpointError:
        vfile = self.path / VERSION_FILE
        return CheckpointError(
            f"{vfile}: {committed_text}, but {self.path} holds trained checkpoint files; "
            f"refusing to delete them: {self._recovery_hint()}"
        )

    def open_for_reading(self) -> int:
        """The committed version (> 0) for a reader, or a CheckpointError saying what is wrong.

        Nothing is written or deleted.
        """
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: no such checkpoint directory")
        version = self.committed_version()
        if version > 0:
            return version
        vfile = self.path / VERSION_FILE
        if self.versions_found():
            state = "missing" if not vfile.exists() else "holds no committed version"
            raise CheckpointError(f"{vfile}: {state}; {self._recovery_hint()}")
        raise CheckpointError(f"{self.path}: no complete checkpoint ({VERSION_FILE} missing)")

    def open_for_training(self) -> int:
        """Create the directory if needed, discard an interrupted step's files, return the
        committed version (0: nothing committed yet). Step 1 of the writer's protocol."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_error(self.path, exc) from None
        removed = self.discard_uncommitted()
        if removed:
            logger.info("removed %d files of an interrupted step in %s", removed, self.path)
        return self.committed_version()

    def files_of(self, version: int) -> list[Path]:
        if not self.path.is_dir():
            return []
        out = []
        for p in self.path.iterdir():
            m = _VERSIONED.match(p.name)
            if m and int(m.group("version")) == version:
                out.append(p)
        return out

    def discard_uncommitted(self) -> int:
        """Prepare the directory for training; returns how many leftover files were removed.

        Removes what an interrupted run left: temporary files and snapshot directories with
        names bigembed creates, and the files of versions newer than the committed one. The
        latter only when that is provably safe: a valid committed version exists, or the
        directory is marked as holding the first, uncommitted version of a run that started
        from nothing (:data:`FRESH_MARKER`). A missing, empty or zero version file next to
        trained files is refused with a recovery hint instead: nothing is deleted.
        When nothing is committed, the fresh-run marker is written before any trained file.
        """
        if not self.path.is_dir():
            return 0
        committed = self.committed_version()
        vfile = self.path / VERSION_FILE
        marker = self.path / FRESH_MARKER
        newer = [
            p
            for p in self.path.iterdir()
            if (m := _VERSIONED.match(p.name)) and int(m.group("version")) > committed
        ]
        if committed > 0 and newer and not self._complete(committed):
            raise CheckpointError(
                f"{vfile}: says version {committed}, but {self.metadata_path(committed).name} or "
                f"{self.model_path(committed).name} is missing; refusing to delete the files of "
                f"newer versions: {self._recovery_hint()}"
            )
        if committed == 0 and newer:
            ours = marker.exists() and all(
                int(_VERSIONED.match(p.name).group("version")) == 1  # type: ignore[union-attr]
                for p in newer
            )
            if not ours:
                state = "missing" if not vfile.exists() else "holds no committed version"
                raise self._unproven_files_error(state)
        removed = self._remove_temporaries()
        for p in newer:
            if p.is_dir():
                raise CheckpointError(f"{p}: a directory where bigembed keeps a checkpoint file")
            p.unlink()
            removed += 1
        try:
            if committed == 0:
                atomic_write_text(marker, f"first version of a run started at {time.time()}\n")
            elif marker.exists():
                marker.unlink()
        except OSError as exc:
            raise _write_error(marker, exc) from None
        return removed

    def _remove_temporaries(self) -> int:
        """Delete temporary files and snapshot directories of an interrupted write or preserve.

        Only names bigembed creates are touched; a snapshot directory holding anything else is
        refused rather than deleted.
        """
        removed = 0
        for p in self.path.iterdir():
            if _TMP_SNAPSHOT.match(p.name) and p.is_dir() and not p.is_symlink():
                foreign = [
                    c.name
                    for c in p.iterdir()
                    if not (_is_own_name(c.name) or _is_own_temporary(c.name))
                ]
                if foreign:
                    raise CheckpointError(
                        f"{p}: left by an interrupted snapshot but holds {foreign[0]!r}, which "
                        "bigembed did not write; move it away"
                    )
                shutil.rmtree(p)
                removed += 1
            elif _is_own_temporary(p.name) and p.is_file():
                p.unlink()
                removed += 1
        return removed

    # ------------------------------------------------------------------ partitions
    def embeddings_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"embeddings_{partition_key_text(etype, part)}.v{version}.npy"

    def optimizer_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"optimizer_{partition_key_text(etype, part)}.v{version}.npy"

    def has_partition(self, etype: str, part: int, version: int) -> bool:
        return self.embeddings_path(etype, part, version).exists()

    def save_partition(
        self, etype: str, part: int, version: int, emb: torch.Tensor, state: torch.Tensor
    ) -> None:
        for target, tensor in (
            (self.embeddings_path(etype, part, version), emb),
            (self.optimizer_path(etype, part, version), state),
        ):
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                with atomic_file(target) as tmp, open(tmp, "wb") as f:
                    np.save(f, tensor.detach().numpy(), allow_pickle=False)
            except OSError as exc:
                raise _write_error(target, exc) from None

    def check_partition(self, etype: str, part: int, version: int, count: int, dim: int) -> None:
        """Check a stored partition's file headers against ``(count, dim)`` before allocating."""
        epath = self.embeddings_path(etype, part, version)
        shape, _dtype = npy_header(epath)
        if shape != (count, dim):
            raise CheckpointError(
                f"{epath}: shape {shape} does not match the entity count and dimension "
                f"{(count, dim)} (was the graph re-imported or the dimension changed?)"
            )
        spath = self.optimizer_path(etype, part, version)
        if spath.exists():
            sshape, _ = npy_header(spath)
            if sshape != (count,):
                raise CheckpointError(
                    f"{spath}: shape {sshape} does not match the entity count {count}"
                )

    def load_partition(
        self,
        etype: str,
        part: int,
        version: int,
        out_emb: torch.Tensor,
        out_state: torch.Tensor,
        *,
        require_state: bool = False,
    ) -> None:
        """Read a partition straight into preallocated (possibly shared-memory) tensors.

        ``require_state``: the optimizer file must be there (a committed checkpoint of this
        run); otherwise a missing one leaves the state at zero (a warm start).
        """
        epath = self.embeddings_path(etype, part, version)
        state_path = self.optimizer_path(etype, part, version)
        if require_state and not state_path.exists():
            raise CheckpointError(
                f"{state_path}: missing from checkpoint version {version} (its optimizer state "
                "would be lost); restore the file or train into a new checkpoint_path"
            )
        try:
            emb = np.load(epath, mmap_mode="c", allow_pickle=False)
            state = (
                np.load(state_path, mmap_mode="c", allow_pickle=False)
                if state_path.exists()
                else None
            )
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{epath}: cannot read partition: {exc}") from None
        if tuple(emb.shape) != tuple(out_emb.shape):
            raise CheckpointError(
                f"{epath}: shape {tuple(emb.shape)} does not match the entity count and dimension "
                f"{tuple(out_emb.shape)} (was the graph re-imported or the dimension changed?)"
            )
        if require_state and (state is None or state.shape != (out_emb.shape[0],)):
            raise CheckpointError(
                f"{state_path}: shape {None if state is None else state.shape} does not match "
                f"the entity count {out_emb.shape[0]}"
            )
        out_emb.copy_(torch.from_numpy(emb))
        if state is not None and state.shape == (out_emb.shape[0],):
            out_state.copy_(torch.from_numpy(state))
        else:
            out_state.zero_()

    def link_partition(self, etype: str, part: int, src_version: int, dst_version: int) -> None:
        """Carry an untouched partition into the new version without copying (hard link)."""
        for getter in (self.embeddings_path, self.optimizer_path):
            src, dst = getter(etype, part, src_version), getter(etype, part, dst_version)
            if src.exists() and not dst.exists():
                try:
                    os.link(src, dst)
                except OSError:
                    tmp = dst.with_name(f".{dst.name}.tmp")
                    try:
                        shutil.copyfile(src, tmp)
                        os.replace(tmp, dst)
                    except OSError as exc:
                        with contextlib.suppress(OSError):
                            tmp.unlink()
                        raise _write_error(dst, exc) from None

    # ------------------------------------------------------------------ model + metadata
    def model_path(self, version: int) -> Path:
        return self.path / f"model.v{version}.pt"

    def metadata_path(self, version: int) -> Path:
        return self.path / f"metadata.v{version}.json"

    def save_model(self, version: int, payload: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(payload, buf)
        path = self.model_path(version)
        try:
            atomic_write_bytes(path, buf.getvalue())
        except OSError as exc:
            raise _write_error(path, exc) from None

    def load_model(self, version: int, *, mmap: bool = False) -> dict[str, Any]:
        """The model payload; ``mmap`` maps the tensors instead of reading them."""
        path = self.model_path(version)
        if not path.exists():
            raise CheckpointError(f"{path}: missing (incomplete checkpoint?)")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read model parameters: {exc}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
            raise CheckpointError(f"{path}: not a bigembed model file (no 'model' entry)")
        return payload

    def write_metadata(self, metadata: CheckpointMetadata) -> None:
        """Write ``metadata.v{metadata.version}.json`` (atomically; not committed yet)."""
        path = self.metadata_path(metadata.version)
        try:
            atomic_write_text(path, json.dumps(metadata.to_json(), indent=1, sort_keys=True))
        except OSError as exc:
            raise _write_error(path, exc) from None

    def read_metadata(self, version: int | None = None) -> CheckpointMetadata:
        """The validated metadata record of ``version`` (default: the committed one)."""
        version = self.committed_version() if version is None else version
        path = self.metadata_path(version)
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise CheckpointError(
                f"{path}: missing (no complete checkpoint in {self.path})"
            ) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: corrupt metadata ({exc})") from None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return CheckpointMetadata.from_json(data, path, version=version)

    # ------------------------------------------------------------------ stats
    def read_stats(self, max_version: int | None = None) -> list[dict[str, Any]]:
        """The stats records (of versions up to ``max_version``).

        The stats file is a log, not training state: a line that is not a JSON object with an
        integer ``version`` (a damaged file) is left out with one warning per store, so that it
        never blocks training; the next commit rewrites the file without it.
        """
        records, bad = self.read_stats_checked(max_version)
        if bad and not self._warned_stats:
            self._warned_stats = True
            logger.warning(
                "%s: ignoring %d unreadable line(s) (first: line %d); they are dropped when the "
                "file is next rewritten",
                self.path / STATS_FILE,
                len(bad),
                bad[0],
            )
        return records

    def read_stats_checked(
        self, max_version: int | None = None
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """The readable records and the (1-based) numbers of the lines that are not."""
        path = self.path / STATS_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
        records, bad = [], []
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                rec = None
            if not isinstance(rec, dict) or not isinstance(rec.get("version", 0), int):
                bad.append(number)
                continue
            if max_version is None or rec.get("version", 0) <= max_version:
                records.append(rec)
        return records, bad

    def append_stats(self, records: list[dict[str, Any]], committed: int) -> None:
        """Rewrite the stats file atomically: committed lines plus ``records``."""
        kept = self.read_stats(max_version=committed)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept + records)
        path = self.path / STATS_FILE
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise _write_error(path, exc) from None

    def write_config(self, text: str) -> None:
        path = self.path / CONFIG_FILE
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise _write_error(path, exc) from None

    # ------------------------------------------------------------------ commit
    def commit(self, version: int, keep_versions: set[int] | None = None) -> None:
        """Make ``version`` the committed one, then drop the files of older versions."""
        previous = self.committed_version()
        vfile = self.path / VERSION_FILE
        try:
            atomic_write_text(vfile, f"{version}\n")
        except OSError as exc:
            raise _write_error(vfile, exc) from None
        keep = keep_versions or set()
        with contextlib.suppress(FileNotFoundError):
            (self.path / FRESH_MARKER).unlink()
        if previous and previous not in keep and previous != version:
            for p in self.files_of(previous):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        fsync_dir(self.path)

    def preserve(self, version: int, epoch: int) -> Path:
        """Keep a snapshot of ``version`` in ``epoch_{epoch}/`` (hard links, so no copy)."""
        return self._snapshot(version, f"epoch_{epoch}", {})

    def _snapshot(self, version: int, name: str, extra: dict[str, str]) -> Path:
        """``name/``: a checkpoint directory of its own holding ``version`` (hard links), the
        config and stats, and the ``extra`` files; built aside and swapped in by renames."""
        snap = self.path / name
        tmp = self.path / f".{name}.tmp"
        old = self.path / f".{name}.old.tmp"
        try:
            if tmp.exists() or old.exists():
                self._remove_temporaries()
            tmp.mkdir(parents=True)
            for p in self.files_of(version):
                os.link(p, tmp / p.name)
            atomic_write_text(tmp / VERSION_FILE, f"{version}\n")
            for own in (CONFIG_FILE, STATS_FILE):
                if (self.path / own).exists():
                    shutil.copyfile(self.path / own, tmp / own)
            for extra_name, text in extra.items():
                atomic_write_text(tmp / extra_name, text)
            if snap.exists():
                os.replace(snap, old)
            os.replace(tmp, snap)
            fsync_dir(self.path)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(snap, exc) from None
        return snap

    # ------------------------------------------------------------------ best version
    def read_best(self) -> dict[str, Any] | None:
        """``best/best.json`` when ``best/`` is bigembed's snapshot of a version, else None."""
        path = self.path / BEST_DIR / BEST_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        ours = isinstance(data, dict) and data.get("written_by") == "bigembed"
        if ours and isinstance(data.get("version"), int):
            return data
        return None

    def save_best(self, version: int, info: dict[str, Any]) -> Path:
        """Make ``version`` the kept best one (``best/``, hard links; ``info`` goes to
        ``best/best.json``). A ``best`` entry bigembed did not write is refused, not replaced."""
        snap = self.path / BEST_DIR
        if (snap.exists() or snap.is_symlink()) and (
            snap.is_symlink() or not snap.is_dir() or self.read_best() is None
        ):
            raise CheckpointError(
                f"{snap}: exists but is not bigembed's best-version snapshot (no {BEST_FILE}); "
                "refusing to replace it: move it away"
            )
        record = {"written_by": "bigembed", **info, "version": version}
        return self._snapshot(version, BEST_DIR, {BEST_FILE: json.dumps(record, indent=1)})

    # ------------------------------------------------------------------ validation log
    def read_validation(self, max_version: int | None = None) -> list[dict[str, Any]]:
        """Early stopping's evaluation records (JSON lines), up to ``max_version``; a damaged
        line is skipped with a warning."""
        path = self.path / VALIDATION_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("%s: unreadable (%s); ignoring it", path, exc)
            return []
        out = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                logger.warning("%s:%d: not JSON; line skipped", path, number)
                continue
            if not isinstance(record, dict) or not isinstance(record.get("version"), int):
                logger.warning("%s:%d: no version; line skipped", path, number)
                continue
            if max_version is None or record["version"] <= max_version:
                out.append(record)
        return out

    def append_validation(self, record: dict[str, Any]) -> None:
        """Add one evaluation record (the file is rewritten atomically, records of versions
        newer than ``record``'s dropped: they belong to an abandoned run)."""
        kept = self.read_validation(max_version=int(record["version"]) - 1)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in [*kept, record])
        path = self.path / VALIDATION_FILE
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise _write_error(path, exc) from None
