"""Pass 2 of the import: turn the spilled runs of one input into the buckets of its edge path.

Each run is loaded whole (its size is bounded; an oversized run is first split at random
into smaller ones), its codes are mapped to (partition, offset) with numpy takes, the run is
shuffled, grouped by bucket (stable radix sort on the bucket id) and each bucket's slice is
appended to that bucket's ``.npy`` columns. Random runs + in-run shuffle = a uniformly
random order inside every bucket.
"""

from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bigembed.importing.dictionary import NUM_SHARDS
from bigembed.importing.npyfile import AppendableNpy
from bigembed.importing.runs import RunFiles
from bigembed.storage import bucket_dir

SPLIT_SLACK = 1.5


@dataclass
class SideMap:
    """Entity code (type, shard, index) -> (partition, offset) for one side."""

    shard_base: np.ndarray  # int64 [num_types * 256]: first global id of (type, shard)
    part_of: np.ndarray  # int32 per global id, -1 = dropped by min-count
    offset_of: np.ndarray  # int64 per global id
    type_const: int | None  # the side's entity type index, when it has a single one
    type_of_rel: np.ndarray | None  # else the type index per (final) relation id

    def map(
        self, shard: np.ndarray, index: np.ndarray, rel: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        key = shard.astype(np.int64)
        if self.type_of_rel is not None:
            key += self.type_of_rel[rel].astype(np.int64) * NUM_SHARDS
        elif self.type_const:
            key += self.type_const * NUM_SHARDS
        ids = self.shard_base[key] + index
        return self.part_of[ids], self.offset_of[ids]


class BucketWriter:
    """Appends edges to the bucket files of one edge store under construction."""

    def __init__(
        self,
        directory: Path,
        lhs_parts: int,
        rhs_parts: int,
        dtypes: dict[str, np.dtype],
        has_weights: bool,
    ) -> None:
        self.directory = directory
        self.shape = (lhs_parts, rhs_parts)
        self.dtypes = dtypes
        self.columns = ["lhs", "rhs", "rel"] + (["weight"] if has_weights else [])
        self.files: dict[int, dict[str, AppendableNpy]] = {}
        self.counts = np.zeros(lhs_parts * rhs_parts, dtype=np.int64)

    def append(self, bucket: int, columns: dict[str, np.ndarray]) -> None:
        files = self.files.get(bucket)
        if files is None:
            i, j = divmod(bucket, self.shape[1])
            path = self.directory / bucket_dir(i, j)
            path.mkdir()
            files = {c: AppendableNpy(path / f"{c}.npy", self.dtypes[c]) for c in self.columns}
            self.files[bucket] = files
        for c in self.columns:
            files[c].append(columns[c])
        self.counts[bucket] += len(columns["lhs"])

    def finish(self) -> np.ndarray:
        for files in self.files.values():
            for f in files.values():
                f.finish()
        return self.counts.reshape(self.shape)


@dataclass
class RunProcessor:
    lhs: SideMap
    rhs: SideMap
    rel_remap: np.ndarray | None  # provisional -> final relation id (-1 = dropped)
    writer: BucketWriter
    run_edges: int
    seed: int
    dropped: int = 0

    def process_all(self, runs: RunFiles, index: int, progress: tqdm) -> None:
        """Process every run in order; the next run is computed while this one is written."""
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="bigembed-bucket") as pool:
            ahead: deque[tuple[int, Future]] = deque()
            for run in range(runs.num_runs):
                if runs.sizes[run] > SPLIT_SLACK * self.run_edges:
                    while ahead:
                        self._finish(runs, *ahead.popleft(), progress)
                    self._split(runs, run, (index, run), progress)
                    continue
                ahead.append((run, pool.submit(self._compute, runs, run, (index, run))))
                if len(ahead) >= 2:
                    self._finish(runs, *ahead.popleft(), progress)
            while ahead:
                self._finish(runs, *ahead.popleft(), progress)

    def _finish(self, runs: RunFiles, run: int, future: Future, progress: tqdm) -> None:
        self._write(future.result())
        progress.update(int(runs.sizes[run]))
        runs.remove(run)

    def _process(self, runs: RunFiles, run: int, path: tuple[int, ...], progress: tqdm) -> None:
        size = int(runs.sizes[run])
        if size > SPLIT_SLACK * self.run_edges:
            self._split(runs, run, path, progress)
            return
        self._write(self._compute(runs, run, path))
        progress.update(size)

    def _compute(
        self, runs: RunFiles, run: int, path: tuple[int, ...]
    ) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """Map, shuffle and group one run by bucket: (bucket bounds, columns, dropped)."""
        nb = self.writer.counts.size
        if runs.sizes[run] == 0:
            return np.zeros(nb + 1, dtype=np.int64), {}, 0
        cols = runs.read(run)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 2, *path]))
        rel = cols["rel"]
        if self.rel_remap is not None:
            rel = self.rel_remap[rel]
        lp, lo = self.lhs.map(cols["ls"], cols["li"], np.maximum(rel, 0))
        rp, ro = self.rhs.map(cols["rs"], cols["ri"], np.maximum(rel, 0))
        keep = (lp >= 0) & (rp >= 0) & (rel >= 0)
        weight = cols.get("w")
        dropped = 0
        if not keep.all():
            dropped = int((~keep).sum())
            lp, lo, rp, ro, rel = lp[keep], lo[keep], rp[keep], ro[keep], rel[keep]
            weight = weight[keep] if weight is not None else None
        n = len(lp)
        bucket = lp.astype(np.int64) * self.writer.shape[1] + rp
        bucket = bucket.astype(np.uint16 if nb <= 1 << 16 else np.int64)
        perm = rng.permutation(n)
        order = perm[np.argsort(bucket[perm], kind="stable")]
        bounds = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(np.bincount(bucket, minlength=nb), out=bounds[1:])
        dtypes = self.writer.dtypes
        out = {
            "lhs": lo[order].astype(dtypes["lhs"], copy=False),
            "rhs": ro[order].astype(dtypes["rhs"], copy=False),
            "rel": rel[order].astype(dtypes["rel"], copy=False),
        }
        if weight is not None:
            out["weight"] = weight[order]
        return bounds, out, dropped

    def _write(self, result: tuple[np.ndarray, dict[str, np.ndarray], int]) -> None:
        bounds, out, dropped = result
        self.dropped += dropped
        for b in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
            s, e = bounds[b], bounds[b + 1]
            self.writer.append(b, {c: v[s:e] for c, v in out.items()})

    def _split(self, runs: RunFiles, run: int, path: tuple[int, ...], progress: tqdm) -> None:
        """Scatter an oversized run into random sub-runs of about ``run_edges`` each."""
        size = int(runs.sizes[run])
        parts = math.ceil(size / self.run_edges)
        sub = RunFiles(
            runs.directory / f"split_{'_'.join(map(str, path))}",
            parts,
            has_weights="w" in runs.columns,
        )
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 3, *path]))
        for start in range(0, size, self.run_edges):
            cols = runs.read(run, start, self.run_edges)
            sub.append(cols, rng.integers(0, parts, len(cols["li"]), dtype=np.uint16))
        runs.remove(run)
        for r in range(parts):
            self._process(sub, r, (*path, r), progress)
            sub.remove(r)
