"""Versioned, atomic checkpoints (DESIGN.md invariant 3).

Layout of ``checkpoint_path`` (documented in docs/FORMAT.md):

``checkpoint_version.txt``
    The committed version N: the number of completed (epoch, edge path, edge chunk) steps.
    Written last, atomically: it is the commit point. Missing means "no checkpoint".
``embeddings_{type}_{part}.v{N}.npy`` / ``optimizer_{type}_{part}.v{N}.npy``
    One partition's float32 embeddings ``(count, dim)`` and row-Adagrad state ``(count,)``.
``model.v{N}.pt``
    Relation operator parameters, global embeddings and their Adagrad state (``torch.save``).
``metadata.v{N}.json``
    Format version, config, iteration position, entity counts, timestamp.
``training_stats.json``
    JSON lines, one per trained bucket and per completed step, each tagged with its version.
``epoch_{E}/``
    Snapshots kept by ``checkpoint_preservation_interval`` (hard links to that version's files).

During step N+1, partitions swapped out are written as ``v{N+1}`` ("dirty"). A run killed before
the version file moves to N+1 restarts from N and first deletes every file newer than N, so it
never reads half a step.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigembed.atomic import atomic_file, atomic_write_bytes, atomic_write_text, fsync_dir
from bigembed.errors import CheckpointError

FORMAT_VERSION = 1
VERSION_FILE = "checkpoint_version.txt"
STATS_FILE = "training_stats.json"
_VERSIONED = re.compile(r"^(?P<stem>.+)\.v(?P<version>\d+)\.(?P<ext>npy|pt|json)$")


def partition_stem(entity_type: str, part: int) -> str:
    return f"{entity_type}_{part}"


class CheckpointStore:
    """Reads and writes one checkpoint directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    # ------------------------------------------------------------------ versions
    def committed_version(self) -> int:
        vfile = self.path / VERSION_FILE
        if not vfile.exists():
            return 0
        text = vfile.read_text().strip()
        if not text:
            return 0
        try:
            return int(text)
        except ValueError:
            raise CheckpointError(f"{vfile}: not a version number: {text[:40]!r}") from None

    def exists(self) -> bool:
        return self.committed_version() > 0

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
        """Delete files of versions newer than the committed one (left by a killed run)."""
        if not self.path.is_dir():
            return 0
        committed = self.committed_version()
        removed = 0
        for p in self.path.iterdir():
            m = _VERSIONED.match(p.name)
            if (m and int(m.group("version")) > committed) or (
                p.name.startswith(".") and p.name.endswith(".tmp")
            ):
                p.unlink()
                removed += 1
        return removed

    # ------------------------------------------------------------------ partitions
    def embeddings_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"embeddings_{partition_stem(etype, part)}.v{version}.npy"

    def optimizer_path(self, etype: str, part: int, version: int) -> Path:
        return self.path / f"optimizer_{partition_stem(etype, part)}.v{version}.npy"

    def has_partition(self, etype: str, part: int, version: int) -> bool:
        return self.embeddings_path(etype, part, version).exists()

    def save_partition(
        self, etype: str, part: int, version: int, emb: torch.Tensor, state: torch.Tensor
    ) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for target, tensor in (
            (self.embeddings_path(etype, part, version), emb),
            (self.optimizer_path(etype, part, version), state),
        ):
            with atomic_file(target) as tmp, open(tmp, "wb") as f:
                np.save(f, tensor.detach().numpy(), allow_pickle=False)

    def load_partition(
        self, etype: str, part: int, version: int, out_emb: torch.Tensor, out_state: torch.Tensor
    ) -> None:
        """Read a partition straight into preallocated (possibly shared-memory) tensors."""
        epath = self.embeddings_path(etype, part, version)
        try:
            emb = np.load(epath, mmap_mode="c", allow_pickle=False)
            state_path = self.optimizer_path(etype, part, version)
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
                    shutil.copyfile(src, tmp)
                    os.replace(tmp, dst)

    # ------------------------------------------------------------------ model + metadata
    def model_path(self, version: int) -> Path:
        return self.path / f"model.v{version}.pt"

    def metadata_path(self, version: int) -> Path:
        return self.path / f"metadata.v{version}.json"

    def save_model(self, version: int, payload: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(payload, buf)
        atomic_write_bytes(self.model_path(version), buf.getvalue())

    def load_model(self, version: int) -> dict[str, Any]:
        path = self.model_path(version)
        if not path.exists():
            raise CheckpointError(f"{path}: missing (incomplete checkpoint?)")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read model parameters: {exc}") from None

    def save_metadata(self, version: int, metadata: dict[str, Any]) -> None:
        data = {
            "format_version": FORMAT_VERSION,
            "version": version,
            "time": time.time(),
            **metadata,
        }
        atomic_write_text(self.metadata_path(version), json.dumps(data, indent=1, sort_keys=True))

    def load_metadata(self, version: int | None = None) -> dict[str, Any]:
        version = self.committed_version() if version is None else version
        path = self.metadata_path(version)
        if not path.exists():
            raise CheckpointError(f"{path}: missing (no complete checkpoint in {self.path})")
        data = json.loads(path.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format {data.get('format_version')} is not supported "
                f"(this bigembed reads format {FORMAT_VERSION})"
            )
        return data

    # ------------------------------------------------------------------ stats
    def read_stats(self, max_version: int | None = None) -> list[dict[str, Any]]:
        path = self.path / STATS_FILE
        if not path.exists():
            return []
        lines = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if max_version is None or rec.get("version", 0) <= max_version:
                lines.append(rec)
        return lines

    def append_stats(self, records: list[dict[str, Any]], committed: int) -> None:
        """Rewrite the stats file atomically: committed lines plus ``records``."""
        kept = self.read_stats(max_version=committed)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept + records)
        atomic_write_text(self.path / STATS_FILE, text)

    # ------------------------------------------------------------------ commit
    def commit(self, version: int, keep_versions: set[int] | None = None) -> None:
        """Make ``version`` the committed one, then drop the files of older versions."""
        previous = self.committed_version()
        atomic_write_text(self.path / VERSION_FILE, f"{version}\n")
        keep = keep_versions or set()
        if previous and previous not in keep and previous != version:
            for p in self.files_of(previous):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        fsync_dir(self.path)

    def preserve(self, version: int, epoch: int) -> Path:
        """Keep a snapshot of ``version`` in ``epoch_{epoch}/`` (hard links, so no copy)."""
        snap = self.path / f"epoch_{epoch}"
        tmp = self.path / f".epoch_{epoch}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for p in self.files_of(version):
            os.link(p, tmp / p.name)
        atomic_write_text(tmp / VERSION_FILE, f"{version}\n")
        for name in ("config.json", STATS_FILE):
            if (self.path / name).exists():
                shutil.copyfile(self.path / name, tmp / name)
        if snap.exists():
            shutil.rmtree(snap)
        os.replace(tmp, snap)
        fsync_dir(self.path)
        return snap
