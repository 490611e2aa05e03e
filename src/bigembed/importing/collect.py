"""Pass 1 of the import: read every input once, build the entity and relation dictionaries,
and spill each edge as small integer codes into random runs (see :mod:`~bigembed.importing.runs`).

Per record batch (cheap, no dictionary needed): validate, map relations, group the names of
each entity type by shard. Every ``flush`` (a bounded number of buffered edges): encode all
buffered names against the dictionaries in one hash pass per shard and append the codes to
the run files. Memory: the dictionaries (grow with the entities) plus the buffer.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from bigembed.edgelists import (
    EMPTY_NAME,
    Batch,
    InputFile,
    Problem,
    check_names,
    check_weights,
    combine,
    first_problem,
)
from bigembed.errors import InputError
from bigembed.importing.dictionary import Prepared, ShardedDictionary
from bigembed.importing.relations import RelationMapper
from bigembed.importing.runs import RunFiles

logger = logging.getLogger(__name__)
MAX_RUNS = 1024
MAX_EXAMPLES = 5


@dataclass
class SideTypes:
    """Entity type index of one side (lhs or rhs) per relation id, or one constant type."""

    constant: int | None
    by_relation: np.ndarray | None = None

    def of(self, rel: np.ndarray) -> np.ndarray | None:
        """Type per edge, or None when the side has a single type."""
        if self.constant is not None:
            return None
        assert self.by_relation is not None
        return self.by_relation[rel]


@dataclass
class FileStats:
    """What pass 1 saw in one input file."""

    rows: int = 0  # edges kept
    bad: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[int, str]] = field(default_factory=list)  # (data row, why)

    @property
    def skipped(self) -> int:
        return sum(self.bad.values())


@dataclass
class _Pending:
    rel: np.ndarray
    weight: np.ndarray | None
    lhs_types: np.ndarray | None
    rhs_types: np.ndarray | None
    # per entity type: (prepared names, number of lhs names first, lhs rows, rhs rows)
    groups: dict[int, tuple[Prepared, int, np.ndarray | None, np.ndarray | None]]


class Collector:
    """Runs pass 1 over the inputs, one at a time."""

    def __init__(
        self,
        *,
        num_types: int,
        lhs: SideTypes,
        rhs: SideTypes,
        relations: RelationMapper,
        count_entities: bool,
        skip_bad_lines: bool,
        seed: int,
        buffer_edges: int,
        run_edges: int,
    ) -> None:
        self.dictionaries = [ShardedDictionary(count=count_entities) for _ in range(num_types)]
        self.lhs, self.rhs = lhs, rhs
        self.relations = relations
        self.skip_bad_lines = skip_bad_lines
        self.seed = seed
        self.buffer_edges = buffer_edges
        self.run_edges = run_edges

    # ---- one input file
    def collect(
        self, source: InputFile, index: int, spill_dir: Path, progress: tqdm
    ) -> tuple[RunFiles, FileStats]:
        stats = FileStats()
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 1, index]))
        runs: RunFiles | None = None
        pending: list[_Pending] = []
        pending_edges = 0
        has_weights = source.spec.weight is not None

        def flush(position: int) -> None:
            nonlocal runs, pending, pending_edges
            if runs is None:
                estimate = source.estimate_rows(seen_rows, seen_bytes, position)
                num_runs = min(MAX_RUNS, max(1, math.ceil(estimate * 1.1 / self.run_edges)))
                runs = RunFiles(spill_dir, num_runs, has_weights=has_weights)
            columns = self._encode(pending)
            run_ids = (
                rng.integers(0, runs.num_runs, len(columns["li"]), dtype=np.uint16)
                if runs.num_runs > 1
                else None
            )
            runs.append(columns, run_ids)
            pending, pending_edges = [], 0

        last_position = 1
        seen_batch = False
        seen_rows = seen_bytes = 0
        for item, batch_rows, batch_bytes, position in self._prepared(source, stats, progress):
            seen_batch = True
            seen_rows += batch_rows
            seen_bytes += batch_bytes
            last_position = max(position, 1)
            if item is not None:
                pending.append(item)
                pending_edges += len(item.rel)
            if pending_edges >= self._flush_threshold():
                flush(last_position)
        if not seen_batch or (stats.rows == 0 and not stats.skipped):
            raise InputError(f"{source.path}: no edges in this input (empty file or only a header)")
        if pending or runs is None:
            flush(last_position)
        assert runs is not None
        return runs, stats

    def _prepared(
        self, source: InputFile, stats: FileStats, progress: tqdm
    ) -> Iterator[tuple[_Pending | None, int, int, int]]:
        """Read and prepare batches in a background thread, one or two batches ahead.

        Parsing, validation and shard grouping (pyarrow and numpy release the GIL) then
        overlap with the dictionary merges and spilling done by the caller.
        """
        out: queue.Queue = queue.Queue(maxsize=2)
        stop = threading.Event()

        def produce() -> None:
            try:
                for batch in source.batches():
                    item = self._prepare(source, batch, stats)
                    progress.update(batch.position - progress.n)
                    while not stop.is_set():
                        try:
                            out.put(
                                (item, batch.num_rows, batch.text_bytes, batch.position),
                                timeout=0.1,
                            )
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                out.put(_DONE)
            except BaseException as exc:  # handed to the consumer, re-raised there
                out.put(_Failure(exc))

        thread = threading.Thread(target=produce, name="bigembed-import-reader", daemon=True)
        thread.start()
        try:
            while True:
                got = out.get()
                if got is _DONE:
                    break
                if isinstance(got, _Failure):
                    raise got.exc
                yield got
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    out.get(timeout=0.05)
            thread.join()

    def _flush_threshold(self) -> int:
        entities = sum(len(d) for d in self.dictionaries)
        # Each flush re-hashes the dictionaries: buffering about as many edges as there are
        # entities keeps that overhead bounded by a constant factor.
        return max(self.buffer_edges, min(entities // 2, 8 * self.buffer_edges))

    # ---- per batch
    def _prepare(self, source: InputFile, batch: Batch, stats: FileStats) -> _Pending | None:
        cols = batch.columns
        n = batch.num_rows
        problems: list[Problem] = []
        lhs, p = check_names(cols["lhs"], EMPTY_NAME)
        problems += p
        rhs, p = check_names(cols["rhs"], EMPTY_NAME)
        problems += p
        if "rel" in cols:
            rel, p = self.relations.map(cols["rel"])
            problems += p
        else:
            rel = self.relations.constant(n)
        weight = None
        if "weight" in cols:
            weight, p = check_weights(cols["weight"])
            problems += p
        bad = combine(problems, n)
        if bad is not None:
            if not self.skip_bad_lines:
                row, why = first_problem(problems)
                raise BadRow(source, batch.first_row + row, why)
            self._count_bad(problems, bad, batch.first_row, stats)
            keep = ~bad
            keep_arr = pa.array(keep)
            lhs, rhs = lhs.filter(keep_arr), rhs.filter(keep_arr)
            rel = rel[keep]
            weight = weight[keep] if weight is not None else None
        stats.rows += len(rel)
        if len(rel) == 0:
            return None
        self.relations.add_counts(rel)
        return self._group(lhs, rhs, rel, weight)

    def _count_bad(
        self, problems: list[Problem], bad: np.ndarray, first_row: int, stats: FileStats
    ) -> None:
        claimed = np.zeros(len(bad), dtype=bool)
        for prob in problems:
            mine = prob.mask & ~claimed
            claimed |= mine
            count = int(mine.sum())
            if count:
                stats.bad[prob.reason] += count
                for row in np.flatnonzero(mine)[:MAX_EXAMPLES].tolist():
                    if len(stats.examples) < MAX_EXAMPLES:
                        stats.examples.append((first_row + row, prob.describe(row)))
        stats.examples.sort()
        del stats.examples[MAX_EXAMPLES:]

    def _group(
        self, lhs: pa.Array, rhs: pa.Array, rel: np.ndarray, weight: np.ndarray | None
    ) -> _Pending:
        lhs_types = self.lhs.of(rel)
        rhs_types = self.rhs.of(rel)
        groups: dict[int, tuple[Prepared, int, np.ndarray | None, np.ndarray | None]] = {}
        types: set[int] = set()
        for side, per_edge in ((self.lhs, lhs_types), (self.rhs, rhs_types)):
            if per_edge is not None:
                types.update(np.unique(per_edge).tolist())
            else:
                assert side.constant is not None  # of() is None only for a single-type side
                types.add(side.constant)
        for t in sorted(types):
            lhs_rows = _rows(lhs_types, self.lhs.constant, t, len(rel))
            rhs_rows = _rows(rhs_types, self.rhs.constant, t, len(rel))
            parts = []
            n_lhs = 0
            if lhs_rows is not None:
                parts.append(
                    lhs
                    if len(lhs_rows) == len(rel) and lhs_types is None
                    else lhs.take(pa.array(lhs_rows))
                )
                n_lhs = len(lhs_rows)
            if rhs_rows is not None:
                parts.append(
                    rhs
                    if len(rhs_rows) == len(rel) and rhs_types is None
                    else rhs.take(pa.array(rhs_rows))
                )
            values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
            groups[t] = (Prepared(values), n_lhs, lhs_rows, rhs_rows)
        return _Pending(rel, weight, lhs_types, rhs_types, groups)

    # ---- per flush
    def _encode(self, pending: list[_Pending]) -> dict[str, np.ndarray]:
        n = sum(len(p.rel) for p in pending)
        out: dict[str, np.ndarray] = {
            "ls": np.empty(n, dtype=np.uint8),
            "li": np.empty(n, dtype=np.int32),
            "rs": np.empty(n, dtype=np.uint8),
            "ri": np.empty(n, dtype=np.int32),
            "rel": np.concatenate([p.rel for p in pending]) if pending else np.empty(0, np.int32),
        }
        if pending and pending[0].weight is not None:
            out["w"] = np.concatenate([p.weight for p in pending])
        types = sorted({t for p in pending for t in p.groups})
        for t in types:
            members = [(i, p) for i, p in enumerate(pending) if t in p.groups]
            results = self.dictionaries[t].encode_prepared([p.groups[t][0] for _, p in members])
            for (i, p), (shards, codes) in zip(members, results, strict=True):
                base = sum(len(q.rel) for q in pending[:i])
                _prepared, n_lhs, lhs_rows, rhs_rows = p.groups[t]
                n = len(p.rel)
                for side, rows, lo, hi in (("l", lhs_rows, 0, n_lhs), ("r", rhs_rows, n_lhs, None)):
                    if rows is None:
                        continue
                    # all rows of the batch (single-type side): a slice, not a scatter
                    where = slice(base, base + n) if len(rows) == n else base + rows
                    out[side + "s"][where] = shards[lo:hi]
                    out[side + "i"][where] = codes[lo:hi]
        return out


def _rows(types: np.ndarray | None, constant: int | None, t: int, n: int) -> np.ndarray | None:
    """Rows of a side whose entity type is ``t`` (None when there are none)."""
    if types is None:
        return np.arange(n) if constant == t else None
    rows = np.flatnonzero(types == t)
    return rows if len(rows) else None


_DONE = object()


@dataclass
class _Failure:
    exc: BaseException


class BadRow(Exception):
    """A bad row in default (strict) mode; the importer turns it into an InputError."""

    def __init__(self, source: InputFile, row: int, why: str) -> None:
        super().__init__(why)
        self.source = source
        self.row = row
        self.why = why
