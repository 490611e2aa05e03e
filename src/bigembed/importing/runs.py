"""Spill files of pass 1: every edge goes to one of K random "runs" (one file per column).

Assigning runs at random and later shuffling each run in memory gives every bucket a uniformly
random edge order while memory holds only one run (the classic two-pass external shuffle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPILL_COLUMNS: dict[str, np.dtype] = {
    "ls": np.dtype(np.uint8),  # lhs shard
    "li": np.dtype(np.int32),  # lhs index in shard
    "rs": np.dtype(np.uint8),
    "ri": np.dtype(np.int32),
    "rel": np.dtype(np.int32),  # provisional relation id
    "w": np.dtype(np.float32),
}


class RunFiles:
    """K append-only runs in ``directory``; run r column c lives in ``run_{r}.{c}``."""

    def __init__(self, directory: Path, num_runs: int, *, has_weights: bool) -> None:
        self.directory = directory
        self.num_runs = num_runs
        self.columns = [c for c in SPILL_COLUMNS if has_weights or c != "w"]
        self.sizes = np.zeros(num_runs, dtype=np.int64)
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, run: int, column: str) -> Path:
        return self.directory / f"run_{run}.{column}"

    def append(self, columns: dict[str, np.ndarray], runs: np.ndarray | None) -> None:
        """Append edges; ``runs[i]`` is edge i's run (None: everything into run 0)."""
        n = len(columns["li"])
        if n == 0:
            return
        if runs is None or self.num_runs == 1:
            self._write(0, columns)
            return
        order = np.argsort(runs, kind="stable")
        bounds = np.zeros(self.num_runs + 1, dtype=np.int64)
        np.cumsum(np.bincount(runs, minlength=self.num_runs), out=bounds[1:])
        grouped = {c: columns[c][order] for c in self.columns}
        for run in np.flatnonzero(bounds[1:] > bounds[:-1]):
            lo, hi = bounds[run], bounds[run + 1]
            self._write(int(run), {c: grouped[c][lo:hi] for c in self.columns})

    def _write(self, run: int, columns: dict[str, np.ndarray]) -> None:
        for c in self.columns:
            data = np.ascontiguousarray(columns[c], dtype=SPILL_COLUMNS[c])
            with open(self._path(run, c), "ab") as f:
                f.write(data.data.cast("B"))
        self.sizes[run] += len(columns["li"])

    def read(self, run: int, start: int = 0, count: int | None = None) -> dict[str, np.ndarray]:
        """Rows ``[start, start+count)`` of one run."""
        size = int(self.sizes[run])
        count = size - start if count is None else min(count, size - start)
        out = {}
        for c in self.columns:
            dtype = SPILL_COLUMNS[c]
            if count <= 0:
                out[c] = np.empty(0, dtype=dtype)
                continue
            with open(self._path(run, c), "rb") as f:
                out[c] = np.fromfile(f, dtype=dtype, count=count, offset=start * dtype.itemsize)
        return out

    def remove(self, run: int) -> None:
        for c in self.columns:
            self._path(run, c).unlink(missing_ok=True)
