"""The edge store of one edge path: edges grouped in buckets (lhs partition, rhs partition).

Each non-empty bucket is a directory of 1-D ``.npy`` columns (``lhs``, ``rhs``, ``rel`` and
optionally ``weight``), so that a contiguous chunk is read with a memory-mapped slice. Edges
are stored in random order within a bucket: contiguous chunks are unbiased samples.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bigembed.errors import InputError
from bigembed.storage.format import (
    EDGE_FORMAT,
    FORMAT_VERSION,
    IMPORT_ID,
    MANIFEST,
    RELATIONS,
    bucket_dir,
    manifest_error,
    read_manifest,
)

if TYPE_CHECKING:
    from bigembed.storage.entities import EntityStore


@dataclass
class EdgeChunk:
    """Edges as parallel numpy arrays: offsets within the bucket's partitions, relation ids."""

    lhs: np.ndarray
    rhs: np.ndarray
    rel: np.ndarray
    weight: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.lhs.shape[0])


def chunk_range(num_edges: int, chunk_idx: int, num_chunks: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of chunk ``chunk_idx`` of ``num_chunks`` (PBG's rule).

    The chunk size is ``ceil(n / num_chunks)``; the last chunks may be short or empty.
    """
    if num_chunks < 1 or not 0 <= chunk_idx < num_chunks:
        raise ValueError(f"chunk {chunk_idx} of {num_chunks} does not exist")
    size = math.ceil(num_edges / num_chunks)
    start = min(chunk_idx * size, num_edges)
    return start, min(start + size, num_edges)


class EdgeStore:
    """Read access to one imported edge path.

    With ``entities`` the store is checked to come from the same import as that entity store
    (:func:`check_edges_import`).
    """

    def __init__(self, path: str | Path, *, entities: EntityStore | None = None) -> None:
        self.path = Path(path)
        data = read_manifest(self.path, EDGE_FORMAT)
        try:
            self.lhs_partitions = int(data["lhs_partitions"])
            self.rhs_partitions = int(data["rhs_partitions"])
            self.has_weights = bool(data["has_weights"])
            self.dtypes = {k: np.dtype(v) for k, v in data["dtypes"].items()}
            counts = np.asarray(data["bucket_counts"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as exc:
            raise manifest_error(self.path, f"bad or missing field: {exc}") from None
        if counts.shape != (self.lhs_partitions, self.rhs_partitions):
            raise manifest_error(self.path, "bucket_counts does not match the partition counts")
        self._counts = counts
        self.manifest = data
        found = data.get(IMPORT_ID)
        # the import_id of the entity store this store was bucketed against (None: older store)
        self.import_id: str | None = None if found is None else str(found)
        # the config's relation names the ids index (None: dynamic relations, named by the
        # entity store); not checked for stores written before manifests recorded them
        self.records_relations = RELATIONS in data
        names = data.get(RELATIONS)
        self.relation_names: list[str] | None = (
            [str(n) for n in names] if isinstance(names, list) else None
        )
        if entities is not None:
            check_edges_import(entities, self)

    def buckets(self) -> list[tuple[int, int]]:
        """Every bucket (i, j), empty ones included, in row-major order."""
        return [(i, j) for i in range(self.lhs_partitions) for j in range(self.rhs_partitions)]

    def num_edges(self, lhs_part: int, rhs_part: int) -> int:
        self._check_bucket(lhs_part, rhs_part)
        return int(self._counts[lhs_part, rhs_part])

    @property
    def total_edges(self) -> int:
        return int(self._counts.sum())

    def bucket_counts(self) -> np.ndarray:
        return self._counts.copy()

    def _check_bucket(self, lhs_part: int, rhs_part: int) -> None:
        if not (0 <= lhs_part < self.lhs_partitions and 0 <= rhs_part < self.rhs_partitions):
            raise IndexError(
                f"bucket ({lhs_part}, {rhs_part}) outside {self.lhs_partitions}x"
                f"{self.rhs_partitions} in {self.path}"
            )

    def _column(self, lhs_part: int, rhs_part: int, name: str, start: int, end: int) -> np.ndarray:
        dtype = self.dtypes[name]
        if end <= start:
            return np.empty(0, dtype=dtype)
        path = self.path / bucket_dir(lhs_part, rhs_part) / f"{name}.npy"
        try:
            mapped = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise InputError(f"{path}: missing (the edge store is incomplete)") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable ({exc})") from None
        expected = int(self._counts[lhs_part, rhs_part])
        if mapped.shape != (expected,) or mapped.dtype != dtype:
            raise InputError(
                f"{path}: holds {mapped.shape} {mapped.dtype}, the manifest says "
                f"({expected},) {dtype}"
            )
        out = np.array(mapped[start:end])
        del mapped
        return out

    def load_chunk(
        self, lhs_part: int, rhs_part: int, chunk_idx: int, num_chunks: int
    ) -> EdgeChunk:
        """Chunk ``chunk_idx`` of ``num_chunks`` of bucket (lhs_part, rhs_part)."""
        n = self.num_edges(lhs_part, rhs_part)
        start, end = chunk_range(n, chunk_idx, num_chunks)
        return self.load_range(lhs_part, rhs_part, start, end)

    def load_range(self, lhs_part: int, rhs_part: int, start: int, end: int) -> EdgeChunk:
        """Rows ``[start, end)`` of one bucket (read through a memory map: only those rows)."""
        self._check_bucket(lhs_part, rhs_part)
        args = (lhs_part, rhs_part)
        return EdgeChunk(
            lhs=self._column(*args, "lhs", start, end),
            rhs=self._column(*args, "rhs", start, end),
            rel=self._column(*args, "rel", start, end),
            weight=self._column(*args, "weight", start, end) if self.has_weights else None,
        )

    def load_bucket(self, lhs_part: int, rhs_part: int) -> EdgeChunk:
        return self.load_range(lhs_part, rhs_part, 0, self.num_edges(lhs_part, rhs_part))


def check_edges_import(entities: EntityStore, *edge_stores: EdgeStore) -> None:
    """Refuse edge stores bucketed against another import than ``entities``.

    Their offsets index that other import's partitions: training or evaluating them against
    this entity store would read wrong rows (or fail with an IndexError). Stores written
    before import ids existed (``import_id`` None on the edge side) are not checked.
    """
    for store in edge_stores:
        if store.import_id is not None and store.import_id != entities.import_id:
            raise InputError(
                f"{store.path} was imported with a different entity store than "
                f"{entities.path} (import ids differ); re-run bigembed import"
            )


def check_edges_relations(relation_names: list[str] | None, *edge_stores: EdgeStore) -> None:
    """Refuse edge stores whose relation ids index another relation list than the config's
    (``relation_names``; None: dynamic relations). Changing ``relations`` after the import would
    otherwise train relation 2's edges as relation 1, or fail on an id past the list's end."""

    def show(names: list[str] | None) -> str:
        return "dynamic relations" if names is None else f"relations [{', '.join(names)}]"

    for store in edge_stores:
        if store.records_relations and store.relation_names != relation_names:
            raise InputError(
                f"relations: the config has {show(relation_names)} but {store.path} was "
                f"imported with {show(store.relation_names)}; re-run bigembed import (or "
                "restore the config's relations)"
            )


def write_edge_manifest(
    directory: Path,
    *,
    bucket_counts: np.ndarray,
    dtypes: dict[str, np.dtype],
    has_weights: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the manifest of an edge store whose bucket files are already in ``directory``."""
    manifest: dict[str, Any] = {
        "format": EDGE_FORMAT,
        "format_version": FORMAT_VERSION,
        "lhs_partitions": int(bucket_counts.shape[0]),
        "rhs_partitions": int(bucket_counts.shape[1]),
        "has_weights": has_weights,
        "dtypes": {k: np.dtype(v).name for k, v in dtypes.items()},
        "num_edges": int(bucket_counts.sum()),
        "bucket_counts": bucket_counts.astype(np.int64).tolist(),
    }
    if extra:
        manifest.update(extra)
    (directory / MANIFEST).write_text(json.dumps(manifest) + "\n")
