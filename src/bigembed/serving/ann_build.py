"""Building one entity type's FAISS index from a checkpoint's tables (``bigembed index``).

The kind follows the table's size unless asked for (:func:`choose_kind`):

* ``flat`` (exact) up to :data:`FLAT_MAX_ROWS` rows: a scan of that many rows is already fast;
* ``hnsw`` (graph; all vectors kept in memory, the best recall per query time) up to
  :data:`HNSW_MAX_ROWS` rows;
* ``ivfpq`` beyond, where HNSW's memory and build time grow too large: ``nlist`` (about
  ``sqrt(rows)``) inverted lists of product-quantised codes (about ``pq`` bytes a row), the
  lists' centroids trained by k-means on a sample. Assigning each row to its list compares it
  with every centroid (one matrix product per block), so the build costs ``rows x nlist``
  multiply-adds: ``sqrt(rows)`` lists keep that affordable on a few cores, and the longer
  lists it gives cost little at query time, where the product-quantised scan is cheap and
  the exact rescoring dominates. ``nprobe`` (lists visited per query) is tuned at build time
  to the smallest value whose recall on held-out rows reaches ``target_recall``
  (:mod:`bigembed.serving.ann_tune`) unless given.

Whatever the kind, a query fetches more candidates than asked (``rerank`` times as many for
``ivfpq``, whose distances are approximate) and rescores them exactly with the model, so
the scores shown are the model's own. The metric follows the model's comparator
(:func:`metric_of`): ``cos`` = inner product of unit rows, ``dot`` = inner product, ``l2`` and
``squared_l2`` = Euclidean distance. Rows are the vectors the model compares: stored rows with
``max_norm`` applied plus the type's global embedding (:meth:`EntityTables.adjusted`). They are
read from the checkpoint's memory map a block at a time, so building needs the index, one
block and the k-means sample in memory, not the table.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigembed.checkpoints import CheckpointStore, EntityTables, TrainedModel, load_trained
from bigembed.errors import InputError
from bigembed.serving.ann_files import IndexInfo, checkpoint_root, prune_indexes, save_indexes
from bigembed.serving.ann_tune import TUNE_K, TuningSample, set_ivf_search, tune_nprobe

FLAT_MAX_ROWS = 100_000
HNSW_MAX_ROWS = 2_000_000
KINDS = ("auto", "flat", "hnsw", "ivfpq")
METRIC_OF_COMPARATOR = {"cos": "cos", "dot": "dot", "l2": "l2", "squared_l2": "l2"}
BLOCK_ROWS = 1 << 18  # rows read, prepared and added at a time
KMEANS_ITERATIONS = 10  # enough for inverted lists; each costs a pass over the sample


@dataclass
class IndexKnobs:
    """Build and search settings; None = chosen from the table's size (see :meth:`resolved`)."""

    kind: str = "auto"
    m: int = 32  # hnsw: graph neighbours per node
    ef_construction: int = 200  # hnsw: candidates kept while inserting
    ef_search: int = 128  # hnsw: candidates kept while searching (at least the number fetched)
    nlist: int | None = None  # ivfpq: inverted lists; default sqrt(rows)
    nprobe: int | None = None  # ivfpq: lists visited per query; default tuned (target_recall)
    pq: int | None = None  # ivfpq: bytes per row (sub-quantisers); default dim / 4
    rerank: int = 10  # ivfpq: candidates fetched (and rescored exactly) per result wanted
    train_rows: int | None = None  # ivfpq: k-means sample; default 40 x nlist
    target_recall: float = 0.95  # ivfpq: recall@10 the tuned nprobe reaches on held-out rows
    tune_queries: int = 500  # ivfpq: held-out rows searched to tune nprobe

    def resolved(self, rows: int, dim: int) -> dict[str, Any]:
        """The knobs that apply to the chosen kind, with size-based defaults filled in
        (``nprobe`` None: to be tuned)."""
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
        if not 0 < self.target_recall <= 1:
            raise InputError(f"--target-recall {self.target_recall}: must be in (0, 1]")
        nlist = self.nlist or max(1, min(rows // 39, math.isqrt(rows)))
        pq = self.pq or max(1, dim // 4)
        if dim % pq:
            raise InputError(f"--pq {pq}: must divide the dimension {dim}")
        tune = 0 if self.nprobe else min(self.tune_queries, rows // 10)
        return {
            "kind": kind,
            "nlist": nlist,
            "nprobe": min(nlist, self.nprobe) if self.nprobe else None,
            "pq": pq,
            "rerank": self.rerank,
            "train_rows": min(rows - tune, self.train_rows or 40 * nlist),
            "target_recall": None if self.nprobe else self.target_recall,
            "tune_queries": tune,
        }


@dataclass
class BuildWatch:
    """What a build reports as it goes (the command shows a progress bar): ``step`` one line
    per stage; ``rows`` the rows just added of a type's total."""

    step: Callable[[str], None] | None = None
    rows: Callable[[str, int, int], None] | None = None

    def say(self, line: str) -> None:
        if self.step is not None:
            self.step(line)


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


class RowReader:
    """The rows of one type as the index holds them (global id order), from the memory map."""

    def __init__(self, trained: TrainedModel, tables: EntityTables, etype: str, metric: str):
        self.trained, self.tables, self.etype, self.metric = trained, tables, etype, metric
        self.bases = tables.bases(etype)

    def prepare(self, stored: np.ndarray) -> np.ndarray:
        """Stored rows -> indexed rows: ``max_norm`` as :class:`EntityTables` applies it, the
        global embedding, unit length for ``cos``."""
        x = torch.from_numpy(np.array(stored, dtype=np.float32, order="C"))
        max_norm = self.tables.max_norm
        if max_norm is not None:
            x.mul_((max_norm / x.norm(dim=1, keepdim=True).clamp_min(1e-7)).clamp_max(1.0))
        x = self.tables.adjusted(self.etype, x)
        if self.metric == "cos":
            x = torch.nn.functional.normalize(x, dim=-1)
        return np.ascontiguousarray(x.numpy(), dtype=np.float32)

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(global id of the first row, rows) of at most :data:`BLOCK_ROWS` rows."""
        for part in range(len(self.bases) - 1):
            lo, hi = int(self.bases[part]), int(self.bases[part + 1])
            if hi == lo:
                continue
            mapped = self.trained.mapped_embeddings(self.etype, part)
            for b0 in range(0, hi - lo, BLOCK_ROWS):
                yield lo + b0, self.prepare(mapped[b0 : b0 + BLOCK_ROWS])

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows of the sorted global ``ids``."""
        out = []
        parts = np.searchsorted(self.bases, ids, side="right") - 1
        for part in np.unique(parts):
            mapped = self.trained.mapped_embeddings(self.etype, int(part))
            out.append(self.prepare(mapped[ids[parts == part] - self.bases[part]]))
        return np.concatenate(out) if out else np.empty((0, self.tables.dimension(self.etype)))


def _ivfpq(dim: int, fmetric: int, params: dict[str, Any]) -> Any:
    """An untrained IVF-PQ index (the Python object keeps its coarse quantizer alive)."""
    import faiss

    quantizer = faiss.IndexFlat(dim, fmetric)
    index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["pq"], 8, fmetric)
    index.cp.niter = KMEANS_ITERATIONS
    return index


def build_index(
    trained: TrainedModel,
    tables: EntityTables,
    etype: str,
    metric: str,
    knobs: IndexKnobs,
    watch: BuildWatch | None = None,
) -> tuple[Any, IndexInfo]:
    """The index of every entity of ``etype`` (ids = global ids), and its record."""
    import faiss

    watch = watch or BuildWatch()
    rows, dim = tables.total(etype), tables.dimension(etype)
    params = knobs.resolved(rows, dim)
    kind = params["kind"]
    fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    reader = RowReader(trained, tables, etype, metric)
    start = time.perf_counter()
    index: Any
    sample: TuningSample | None = None
    if kind == "flat":
        index = faiss.IndexFlat(dim, fmetric)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["m"], fmetric)
        index.hnsw.efConstruction = params["ef_construction"]
    else:
        index = _ivfpq(dim, fmetric, params)
        tune, train = params["tune_queries"], params["train_rows"]
        ids = np.random.default_rng(0).choice(rows, size=tune + train, replace=False)
        if tune:
            tune_ids = np.sort(ids[:tune])
            sample = TuningSample(tune_ids, reader.rows(tune_ids), metric)
        watch.say(f"{etype}: k-means of {params['nlist']:,} lists on {train:,} rows")
        index.train(reader.rows(np.sort(ids[tune:])))
    for first, block in reader.blocks():
        index.add(block)
        if sample is not None:
            sample.push(first, block)
        if watch.rows is not None:
            watch.rows(etype, len(block), rows)
    if kind == "ivfpq":
        if sample is not None:
            watch.say(f"{etype}: tuning nprobe on {len(sample.ids)} held-out rows")
            fetch = TUNE_K * max(1, params["rerank"])
            nprobe, recall = tune_nprobe(
                index, sample, params["nlist"], fetch, params["target_recall"], watch.step
            )
            params.update(nprobe=nprobe, tuned_recall=round(recall, 4))
        set_ivf_search(index, params["nprobe"])
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
    watch: BuildWatch | None = None,
) -> tuple[Path, list[IndexInfo]]:
    """Build the index of each entity type (``types``; default all) of the committed version
    in ``checkpoint_dir`` (a checkpoint directory or its ``best/``) and publish them in
    ``index/v{N}/`` of the checkpoint; indexes of versions the checkpoint no longer holds
    (neither the latest nor the best) are deleted. ``metric`` (default: the comparator's) is
    "cos", "dot" or "l2"; ``progress`` is called with each index's record when it is built,
    ``watch`` as it is built. Returns the folder and each index's record."""
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
        index, info = build_index(trained, tables, etype, metric, knobs or IndexKnobs(), watch)
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
