"""Where ``bigembed index`` keeps its approximate-nearest-neighbour indexes, and reading them
back for a query, refusing one built from another checkpoint version.

Layout, inside the checkpoint directory (the root one, also for ``--version best``)::

    index/v{N}/{type}.faiss    the FAISS index of entity type ``type`` built from version N
    index/v{N}/{type}.json     its :class:`IndexInfo` (version, kind, metric, knobs, sizes)

``index/v{N}/`` is published whole with a rename (:func:`~bigembed.atomic.atomic_directory`), so
a reader sees the old set of indexes or the new one, never half of one. Index ids are global
entity ids (partition by partition), so an index answers in the ids the checkpoint tables use.
An index belongs to one committed version: a query of another version refuses it in one line
(an index of version 3 ranks version 3's embeddings, not those trained since).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigembed.atomic import atomic_directory, atomic_write_text
from bigembed.checkpoints import BEST_DIR, INDEX_DIR, VERSION_FILE, TrainedModel
from bigembed.serving.ann_tune import set_ivf_search
from bigembed.serving.errors import QueryError

logger = logging.getLogger(__name__)

VERSION_DIR = re.compile(r"^v(\d+)$")
SNAPSHOT_DIR = re.compile(rf"^(?:epoch_\d+|{BEST_DIR})$")


@dataclass
class IndexInfo:
    """What ``{type}.json`` records about one index."""

    type: str
    version: int  # the checkpoint version whose embeddings it holds
    checkpoint_time: float  # that version's metadata time: tells a re-trained version N apart
    count: int  # entities (rows) indexed
    dim: int
    kind: str  # "flat", "hnsw" or "ivfpq"
    metric: str  # "cos", "dot" or "l2"
    params: dict[str, Any] = field(default_factory=dict)  # the knobs it was built with
    build_seconds: float = 0.0
    bytes: int = 0  # size of the .faiss file

    @classmethod
    def read(cls, path: Path) -> IndexInfo:
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise QueryError(f"{path}: not a readable index record ({exc})") from None


def checkpoint_root(trained: TrainedModel) -> Path:
    """The checkpoint directory itself when ``trained`` was opened from a snapshot in it
    (``best/``, ``epoch_N/``): the indexes of every version live at the root."""
    path = Path(trained.path)
    if SNAPSHOT_DIR.match(path.name) and (path.parent / VERSION_FILE).exists():
        return path.parent
    return path


def version_dir(root: Path, version: int) -> Path:
    return root / INDEX_DIR / f"v{version}"


def built_versions(root: Path, etype: str) -> list[int]:
    """The versions with an index of ``etype``, ascending."""
    base = root / INDEX_DIR
    if not base.is_dir():
        return []
    found = [int(m.group(1)) for p in base.iterdir() if (m := VERSION_DIR.match(p.name))]
    return sorted(v for v in found if (version_dir(root, v) / f"{etype}.faiss").exists())


def save_indexes(root: Path, version: int, built: dict[str, tuple[Any, IndexInfo]]) -> Path:
    """Publish the indexes of ``version`` (``{type: (faiss index, info)}``) in one rename;
    the indexes of other types already built for that version are kept."""
    import faiss

    final = version_dir(root, version)
    with atomic_directory(final, force=True) as tmp:
        if final.is_dir():
            for p in final.iterdir():
                if p.stem not in built:
                    os.link(p, tmp / p.name)
        for etype, (index, info) in built.items():
            faiss.write_index(index, str(tmp / f"{etype}.faiss"))
            info.bytes = (tmp / f"{etype}.faiss").stat().st_size
            atomic_write_text(tmp / f"{etype}.json", json.dumps(asdict(info), indent=1) + "\n")
    return final


def prune_indexes(root: Path, keep: set[int]) -> list[int]:
    """Delete the index folders of versions not in ``keep`` (no longer in the checkpoint)."""
    base = root / INDEX_DIR
    removed = []
    if base.is_dir():
        for p in base.iterdir():
            m = VERSION_DIR.match(p.name)
            if m and int(m.group(1)) not in keep and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
                removed.append(int(m.group(1)))
    return sorted(removed)


class LoadedIndex:
    """One type's FAISS index, ready to search with its stored search knobs."""

    def __init__(self, index: Any, info: IndexInfo, path: Path) -> None:
        self.index = index
        self.info = info
        self.path = path
        self.rerank = max(1, int(info.params.get("rerank", 1)))
        self.ef_search = int(info.params.get("ef_search", 0))
        if info.kind == "ivfpq":
            set_ivf_search(index, int(info.params["nprobe"]))

    def search(self, queries: np.ndarray, fetch: int) -> np.ndarray:
        """Ids (global; -1 where fewer exist) of the ``fetch`` nearest rows per query, in the
        index's metric (queries are normalised here for "cos")."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if self.info.metric == "cos":
            q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        if self.info.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, fetch)
        _, ids = self.index.search(q, min(fetch, self.info.count))
        return ids


class IndexCache:
    """The index of each entity type of one opened checkpoint version, read at first use."""

    def __init__(self, trained: TrainedModel, totals: dict[str, int]) -> None:
        self.trained = trained
        self.root = checkpoint_root(trained)
        self.totals = totals
        self._loaded: dict[str, LoadedIndex | None] = {}
        self._said: set[str] = set()

    def note(self, line: str) -> None:
        """Log ``line`` (INFO) the first time only."""
        if line not in self._said:
            self._said.add(line)
            logger.info("%s", line)

    def get(self, etype: str) -> LoadedIndex | None:
        """The index of ``etype`` for this version; None when none was built; a
        :class:`QueryError` (one line) when the one there is for another version."""
        if etype not in self._loaded:
            self._loaded[etype] = self._read(etype)
        return self._loaded[etype]

    def _read(self, etype: str) -> LoadedIndex | None:
        version = self.trained.version
        path = version_dir(self.root, version) / f"{etype}.faiss"
        rebuild = (
            f"rebuild it (bigembed index {self.root} --version ...) or search exactly (--exact, "
            "exact=True)"
        )
        if not path.exists():
            others = built_versions(self.root, etype)
            if not others:
                return None
            raise QueryError(
                f"{self.root / INDEX_DIR}: the {etype!r} index was built from checkpoint version "
                f"{others[-1]}, not version {version} being queried; {rebuild}"
            )
        info = IndexInfo.read(path.with_suffix(".json"))
        if (
            info.version != version
            or info.checkpoint_time != self.trained.metadata.time
            or info.count != self.totals[etype]
        ):
            raise QueryError(
                f"{path}: built from another checkpoint of version {info.version} "
                f"({info.count:,} entities; this one has {self.totals[etype]:,}); {rebuild}"
            )
        try:
            import faiss
        except ImportError:
            raise QueryError(
                f"{path}: reading it needs FAISS (pip install 'bigembed[ann]'), or search exactly "
                "(--exact, exact=True)"
            ) from None
        self.note(f"searching the {info.kind} index {path} (--exact scans every entity)")
        return LoadedIndex(faiss.read_index(str(path)), info, path)
