"""Versioned, atomic checkpoints: the one reader and writer of a checkpoint directory.

The directory's layout is :mod:`bigembed.checkpoints.layout` (and docs/FORMAT.md); a
partition's files :mod:`bigembed.checkpoints.partition_files`; the stats and validation logs
:mod:`bigembed.checkpoints.logs`; ``epoch_N/`` and ``best/`` :mod:`bigembed.checkpoints.snapshots`.
:class:`CheckpointStore` uses them all and owns the protocol below: nothing else writes to a
checkpoint directory.

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
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from bigembed.atomic import atomic_write_bytes, atomic_write_text, fsync_dir
from bigembed.checkpoints.layout import (
    CONFIG_FILE,
    FRESH_MARKER,
    STATS_FILE,
    VALIDATION_FILE,
    VERSION_FILE,
    remove_temporaries,
    version_files,
    version_of,
    versions_in,
    write_error,
)
from bigembed.checkpoints.logs import read_stats_lines, read_validation_lines, write_lines
from bigembed.checkpoints.metadata import CheckpointMetadata, partition_key_text
from bigembed.checkpoints.partition_files import (
    check_partition_files,
    link_file,
    read_partition_files,
    write_partition_files,
)
from bigembed.checkpoints.snapshots import make_snapshot, read_best_record, snapshot_best
from bigembed.errors import CheckpointError

__all__ = ["CheckpointStore"]

logger = logging.getLogger(__name__)


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
        return versions_in(self.path)

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
            raise write_error(self.path, exc) from None
        removed = self.discard_uncommitted()
        if removed:
            logger.info("removed %d files of an interrupted step in %s", removed, self.path)
        return self.committed_version()

    def files_of(self, version: int) -> list[Path]:
        """The files of ``version`` in the directory."""
        return version_files(self.path, version)

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
            if (v := version_of(p.name)) is not None and v > committed
        ]
        if committed > 0 and newer and not self._complete(committed):
            raise CheckpointError(
                f"{vfile}: says version {committed}, but {self.metadata_path(committed).name} or "
                f"{self.model_path(committed).name} is missing; refusing to delete the files of "
                f"newer versions: {self._recovery_hint()}"
            )
        if committed == 0 and newer:
            ours = marker.exists() and all(version_of(p.name) == 1 for p in newer)
            if not ours:
                state = "missing" if not vfile.exists() else "holds no committed version"
                raise self._unproven_files_error(state)
        removed = remove_temporaries(self.path)
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
            raise write_error(marker, exc) from None
        return removed

    def commit(self, version: int, keep_versions: set[int] | None = None) -> None:
        """Make ``version`` the committed one, then drop the files of older versions. Step 3
        of the writer's protocol."""
        previous = self.committed_version()
        vfile = self.path / VERSION_FILE
        try:
            atomic_write_text(vfile, f"{version}\n")
        except OSError as exc:
            raise write_error(vfile, exc) from None
        keep = keep_versions or set()
        with contextlib.suppress(FileNotFoundError):
            (self.path / FRESH_MARKER).unlink()
        if previous and previous not in keep and previous != version:
            for p in self.files_of(previous):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        fsync_dir(self.path)

    # ------------------------------------------------------------------ partitions
    def embeddings_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"embeddings_{partition_key_text(etype, part)}.v{version}.npy"

    def optimizer_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"optimizer_{partition_key_text(etype, part)}.v{version}.npy"

    def _partition_paths(self, etype: str, part: int, version: int) -> tuple[Path, Path]:
        return self.embeddings_path(etype, part, version), self.optimizer_path(etype, part, version)

    def has_partition(self, etype: str, part: int, version: int) -> bool:
        return self.embeddings_path(etype, part, version).exists()

    def save_partition(
        self, etype: str, part: int, version: int, emb: torch.Tensor, state: torch.Tensor
    ) -> None:
        epath, spath = self._partition_paths(etype, part, version)
        write_partition_files(self.path, epath, spath, emb, state)

    def check_partition(self, etype: str, part: int, version: int, count: int, dim: int) -> None:
        """Check a stored partition's file headers against ``(count, dim)`` before allocating."""
        epath, spath = self._partition_paths(etype, part, version)
        check_partition_files(epath, spath, count, dim)

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
        epath, spath = self._partition_paths(etype, part, version)
        read_partition_files(epath, spath, version, out_emb, out_state, require_state=require_state)

    def link_partition(self, etype: str, part: int, src_version: int, dst_version: int) -> None:
        """Carry an untouched partition into the new version without copying (hard link)."""
        for getter in (self.embeddings_path, self.optimizer_path):
            link_file(getter(etype, part, src_version), getter(etype, part, dst_version))

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
            raise write_error(path, exc) from None

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
            raise write_error(path, exc) from None

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
        return CheckpointMetadata.from_json(data, path, version)

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
        return read_stats_lines(self.path / STATS_FILE, max_version)

    def append_stats(self, records: list[dict[str, Any]], committed: int) -> None:
        """Rewrite the stats file atomically: committed lines plus ``records``."""
        kept = self.read_stats(max_version=committed)
        write_lines(self.path / STATS_FILE, kept + records)

    def write_config(self, text: str) -> None:
        path = self.path / CONFIG_FILE
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise write_error(path, exc) from None

    # ------------------------------------------------------------------ snapshots
    def preserve(self, version: int, epoch: int) -> Path:
        """Keep a snapshot of ``version`` in ``epoch_{epoch}/`` (hard links, so no copy)."""
        return make_snapshot(self.path, version, f"epoch_{epoch}", {})

    def read_best(self) -> dict[str, Any] | None:
        """``best/best.json`` when ``best/`` is bigembed's snapshot of a version, else None."""
        return read_best_record(self.path)

    def save_best(self, version: int, info: dict[str, Any]) -> Path:
        """Make ``version`` the kept best one (``best/``, hard links; ``info`` goes to
        ``best/best.json``). A ``best`` entry bigembed did not write is refused, not replaced."""
        return snapshot_best(self.path, version, info)

    # ------------------------------------------------------------------ validation log
    def read_validation(self, max_version: int | None = None) -> list[dict[str, Any]]:
        """Early stopping's evaluation records (JSON lines), up to ``max_version``; a damaged
        line is skipped with a warning."""
        return read_validation_lines(self.path / VALIDATION_FILE, max_version)

    def append_validation(self, record: dict[str, Any]) -> None:
        """Add one evaluation record (the file is rewritten atomically, records of versions
        newer than ``record``'s dropped: they belong to an abandoned run)."""
        kept = self.read_validation(max_version=int(record["version"]) - 1)
        write_lines(self.path / VALIDATION_FILE, [*kept, record])
