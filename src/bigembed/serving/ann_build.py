"""Building one entity type's FAISS index from a checkpoint's tables (``bigembed index``).

The kind follows the table's size unless asked for (:func:`choose_kind`):

* ``flat`` (exact) up to :data:`FLAT_MAX_ROWS` rows: a scan of that many rows is already fast;
* ``hnsw`` (graph; all vectors kept in memory, the best recall per query time) up to
  :data:`HNSW_MAX_ROWS` rows;
* ``ivfpq`` (inverted lists of product-quantised codes: about ``pq`` bytes a row, trained by
  k-means on a sample) beyond, where HNSW's memory and build time grow too large.

Whatever the kind, a query fetches more candidates than asked (``rerank`` times as many for
``ivfpq``, whose distances are approximate) and rescores them exactly with the model, so
the scores shown are the model's own. The metric follows the model's comparator
(:func:`metric_of`): ``cos`` = inner product of unit rows, ``dot`` = inner product, ``l2`` and
``squared_l2`` = Euclidean distance. Rows are the vectors the model compares: stored rows with
``max_norm`` applied plus the type's global embedding (:meth:`EntityTables.adjusted`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigembed.checkpoints import CheckpointStore, EntityTables, TrainedModel, load_trained
from bigembed.errors import InputError
from bigembed.serving.ann_files import IndexInfo, checkpoint_root, prune_indexes, save_indexes

FLAT_MAX_ROWS = 100_000
HNSW_MAX_ROWS = 2_000_000
KINDS = ("auto", "flat", "hnsw", "ivfpq")
METRIC_OF_COMPARATOR = {"cos": "cos", "dot": "dot", "l2": "l2", "squared_l2": "l2"}


@dataclass
class IndexKnobs:
    """Build and search settings; None = chosen from the table's size (see :meth:`resolved`)."""

    kind: str = "auto"
    m: int = 32  # hnsw: graph neighbours per node
    ef_construction: int = 200  # hnsw: candidates kept while inserting
    ef_search: int = 128  # hnsw: candidates kept while searching (at least the number fetched)
    nlist: int | None = None  # ivfpq: inverted lists; default 4 sqrt(rows)
    nprobe: int | None = None  # ivfpq: lists visited per query; default nlist / 16, >= 16
    pq: int | None = None  # ivfpq: bytes per row (sub-quantisers); default dim / 4
    rerank: int = 10  # ivfpq: candidates fetched (and rescored exactly) per result wanted
    train_rows: int | None = None  # ivfpq: k-means sample; default 40 x nlist

    def resolved(self, rows: int, dim: int) -> dict[str, Any]:
        """The knobs that apply to the chosen kind, with size-based defaults filled in."""
        kind = choose_kind(rows, self.kind)
        if kind == "flat":
            return {"kind": kind}
        if kind == "hnsw":
            return {
                "kind": kind,
                "m": self.m,
                "ef_construction": self.ef_construction,
                "ef_search": self.ef_search,
            }
        nlist = self.nlist or max(1, min(rows // 39, int(4 * math.sqrt(rows))))
        pq = self.pq or max(1, dim // 4)
        if dim % pq:
            raise InputError(f"--pq {pq}: must divide the dimension {dim}")
        return {
            "kind": kind,
            "nlist": nlist,
            "nprobe": min(nlist, self.nprobe or max(16, nlist // 16)),
            "pq": pq,
            "rerank": self.rerank,
            "train_rows": min(rows, self.train_rows or 40 * nlist),
        }


def choose_kind(rows: int, kind: str = "auto") -> str:
    if kind not in KINDS:
        raise InputError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind != "auto":
        return kind
    if rows <= FLAT_MAX_ROWS:
        return "flat"
    return "hnsw" if rows <= HNSW_MAX_ROWS else "ivfpq"


def metric_of(trained: TrainedModel) -> str | None:
    """The index metric of the model's comparator; None when none fits (``bias``)."""
    if trained.config.bias:
        return None
    return METRIC_OF_COMPARATOR.get(trained.config.comparator)


def _rows(tables: EntityTables, etype: str, metric: str, part: int) -> np.ndarray:
    x = tables.adjusted(etype, tables.table(etype, part))
    if metric == "cos":
        x = torch.nn.functional.normalize(x, dim=-1)
    return np.ascontiguousarray(x.numpy(), dtype=np.float32)


def _sample(tables: EntityTables, etype: str, metric: str, n: int, seed: int) -> np.ndarray:
    total = tables.total(etype)
    ids = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
    x = tables.adjusted(etype, tables.gather(etype, ids))
    if metric == "cos":
        x = torch.nn.functional.normalize(x, dim=-1)
    return np.ascontiguousarray(x.numpy(), dtype=np.float32)


def build_index(
    trained: TrainedModel, tables: EntityTables, etype: str, metric: str, knobs: IndexKnobs
) -> tuple[Any, IndexInfo]:
    """The index of every entity of ``etype`` (ids = global ids), and its record."""
    import faiss

    rows, dim = tables.total(etype), tables.dimension(etype)
    params = knobs.resolved(rows, dim)
    kind = params["kind"]
    fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    start = time.perf_counter()
    index: Any
    if kind == "flat":
        index = faiss.IndexFlat(dim, fmetric)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["m"], fmetric)
        index.hnsw.efConstruction = params["ef_construction"]
    else:
        quantizer = faiss.IndexFlat(dim, fmetric)
        index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["pq"], 8, fmetric)
        index.train(_sample(tables, etype, metric, params["train_rows"], seed=0))
    for part in range(tables.num_partitions(etype)):
        if tables.bases(etype)[part + 1] > tables.bases(etype)[part]:
            index.add(_rows(tables, etype, metric, part))
    info = IndexInfo(
        type=etype,
        version=trained.version,
        checkpoint_time=trained.metadata.time,
        count=rows,
        dim=dim,
        kind=kind,
        metric=metric,
        params={k: v for k, v in params.items() if k != "kind"},
        build_seconds=round(time.perf_counter() - start, 3),
    )
    return index, info


def build_indexes(
    checkpoint_dir: str | os.PathLike[str],
    *,
    types: Sequence[str] | None = None,
    knobs: IndexKnobs | None = None,
    metric: str | None = None,
    progress: Callable[[IndexInfo], None] | None = None,
) -> tuple[Path, list[IndexInfo]]:
    """Build the index of each entity type (``types``; default all) of the committed version
    in ``checkpoint_dir`` (a checkpoint directory or its ``best/``) and publish them in
    ``index/v{N}/`` of the checkpoint; indexes of versions the checkpoint no longer holds
    (neither the latest nor the best) are deleted. ``metric`` (default: the comparator's) is
    "cos", "dot" or "l2". Returns the folder and each index's record."""
    import faiss  # noqa: F401  (fail before reading anything when it is missing)

    trained = load_trained(checkpoint_dir)
    tables = EntityTables(trained)
    metric = metric or metric_of(trained)
    if metric is None:
        raise InputError(
            f"{checkpoint_dir}: comparator {trained.config.comparator} with bias has no index "
            "metric that ranks as predict does; pass --metric cos|dot|l2 (for similar)"
        )
    if metric not in ("cos", "dot", "l2"):
        raise InputError(f"--metric must be cos, dot or l2, not {metric!r}")
    known = list(trained.config.entities)
    for t in types or ():
        if t not in known:
            raise InputError(f"--type {t}: no such entity type (known: {', '.join(known)})")
    built = {}
    for etype in types or known:
        index, info = build_index(trained, tables, etype, metric, knobs or IndexKnobs())
        built[etype] = (index, info)
        if progress is not None:
            progress(info)
    root = checkpoint_root(trained)
    folder = save_indexes(root, trained.version, built)
    store = CheckpointStore(root)
    keep = {trained.version, store.committed_version()}
    best = store.read_best()
    if best is not None:
        keep.add(int(best["version"]))
    prune_indexes(root, keep)
    return folder, [info for _, info in built.values()]
