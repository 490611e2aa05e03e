"""The training stats records: one typed record per bucket and per step, with one JSON form.

``training_stats.json`` (written by :meth:`bigembed.checkpoints.store.CheckpointStore.append_stats`)
holds one JSON object per line: the :class:`BucketRecord` lines of a step, then its
:class:`StepRecord` line (``"type": "bucket"`` / ``"type": "step"``). :meth:`to_json` and
:meth:`from_json` are the only places that know the keys; the training loop writes records,
:func:`merge_step_logs` merges the logs of the trainers of a distributed run, and
:func:`read_training_log` is the reader that ``bigembed plot``, ``bigembed train``'s summary and
the benchmarks use.

Keys (unchanged since the first release, so older checkpoints still read):

* both: ``version`` (the checkpoint version the step produced), ``epoch_idx``,
  ``edge_path_idx``, ``edge_chunk_idx``, ``stats`` (:class:`EdgeStats`: ``count`` edges and the
  per-edge means ``loss``, ``reg``, ``violators_lhs``, ``violators_rhs``), ``seconds``,
  ``edges_per_sec``, and, with ``eval_fraction > 0``, ``eval_stats_before`` /
  ``eval_stats_after`` (ranking metrics of the withheld edges, each with its ``count``);
* bucket: ``lhs_partition``, ``rhs_partition``, ``index`` (its place in the step), and in
  distributed runs ``trainer``; where the balance of work was measured (:class:`BucketTiming`):
  ``load_seconds`` (waiting for the bucket's partitions and edges), ``train_seconds`` (the
  Hogwild workers' wall time) and ``worker_seconds`` (each worker's busy time in it);
* step: ``io_bytes_read``, ``io_bytes_written``, and in distributed runs ``net_bytes``,
  ``lock_waits``, ``trainers``; ``kernel`` (``native`` or ``eager``: the training step's path,
  decided once per run) and ``kernel_reason`` (why), absent from files written before them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bigembed.checkpoints import CheckpointStore

logger = logging.getLogger(__name__)

Metrics = dict[str, float]
"""Ranking metrics of withheld edges (``RankingSums.summary()``): count, mr, mrr, hits@k, ..."""


def weighted_mean(items: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Count-weighted mean of per-edge summaries; the counts add up."""
    total = sum(n for n, _ in items)
    out: dict[str, Any] = {"count": total}
    keys = {
        k for _, d in items for k, v in d.items() if isinstance(v, (int, float)) and k != "count"
    }
    for k in sorted(keys):
        out[k] = sum(n * d.get(k, 0.0) for n, d in items) / max(total, 1)
    return out


@dataclass(frozen=True)
class EdgeStats:
    """Training stats of some edges: their count and the per-edge means."""

    count: int = 0
    loss: float = 0.0
    reg: float = 0.0
    violators_lhs: float = 0.0
    violators_rhs: float = 0.0

    @classmethod
    def of_sums(
        cls, count: int, loss: float, reg: float, violators_lhs: int, violators_rhs: int
    ) -> EdgeStats:
        """From the sums over ``count`` edges (what the workers return)."""
        n = max(count, 1)
        return cls(count, loss / n, reg / n, violators_lhs / n, violators_rhs / n)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "loss": self.loss,
            "reg": self.reg,
            "violators_lhs": self.violators_lhs,
            "violators_rhs": self.violators_rhs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EdgeStats:
        return cls(
            int(data.get("count", 0)),
            float(data.get("loss", 0.0)),
            float(data.get("reg", 0.0)),
            float(data.get("violators_lhs", 0.0)),
            float(data.get("violators_rhs", 0.0)),
        )

    @staticmethod
    def merge(parts: Sequence[EdgeStats]) -> EdgeStats:
        """The stats of all the parts' edges (count-weighted means)."""
        return EdgeStats.from_json(weighted_mean([(p.count, p.to_json()) for p in parts]))


def _merge_metrics(parts: Iterable[Metrics | None]) -> Metrics | None:
    present = [(int(m["count"]), m) for m in parts if m is not None]
    return weighted_mean(present) if present else None


@dataclass(frozen=True)
class Position:
    """Where a record belongs: the step's checkpoint version and its (epoch, edge set, chunk)."""

    version: int
    epoch_idx: int
    edge_path_idx: int
    edge_chunk_idx: int

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "epoch_idx": self.epoch_idx,
            "edge_path_idx": self.edge_path_idx,
            "edge_chunk_idx": self.edge_chunk_idx,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Position:
        return cls(
            int(data["version"]),
            int(data.get("epoch_idx", 0)),
            int(data.get("edge_path_idx", 0)),
            int(data.get("edge_chunk_idx", 0)),
        )


def _timing(stats: EdgeStats, seconds: float) -> dict[str, Any]:
    return {"seconds": seconds, "edges_per_sec": stats.count / seconds if seconds > 0 else 0.0}


def _evals(before: Metrics | None, after: Metrics | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if before is not None:
        out["eval_stats_before"] = before
    if after is not None:
        out["eval_stats_after"] = after
    return out


@dataclass(frozen=True)
class BucketTiming:
    """Where a bucket's time went: the balance figures of ``bench/balance_bench.py``."""

    load_seconds: float  # making its partitions resident and loading its edges
    train_seconds: float  # the workers' wall time
    worker_seconds: list[float]  # each worker's busy time (the rest of train_seconds is idle)

    def to_json(self) -> dict[str, Any]:
        return {
            "load_seconds": self.load_seconds,
            "train_seconds": self.train_seconds,
            "worker_seconds": list(self.worker_seconds),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BucketTiming | None:
        if "train_seconds" not in data:
            return None
        return cls(
            float(data.get("load_seconds", 0.0)),
            float(data["train_seconds"]),
            [float(x) for x in data.get("worker_seconds", [])],
        )


@dataclass
class BucketRecord:
    """One bucket trained in one step (``"type": "bucket"``)."""

    at: Position
    lhs_partition: int
    rhs_partition: int
    index: int  # its place among the buckets this trainer trained in the step
    stats: EdgeStats
    seconds: float = 0.0
    eval_before: Metrics | None = None
    eval_after: Metrics | None = None
    trainer: int | None = None  # distributed runs: which trainer trained it
    timing: BucketTiming | None = None

    @property
    def edges_per_sec(self) -> float:
        return self.stats.count / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "bucket", **self.at.to_json()}
        if self.timing is not None:
            out.update(self.timing.to_json())
        out.update(lhs_partition=self.lhs_partition, rhs_partition=self.rhs_partition)
        out.update(index=self.index, stats=self.stats.to_json())
        out.update(_timing(self.stats, self.seconds))
        out.update(_evals(self.eval_before, self.eval_after))
        if self.trainer is not None:
            out["trainer"] = self.trainer
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BucketRecord:
        trainer = data.get("trainer")
        return cls(
            Position.from_json(data),
            int(data["lhs_partition"]),
            int(data["rhs_partition"]),
            int(data.get("index", 0)),
            EdgeStats.from_json(data["stats"]),
            float(data.get("seconds", 0.0)),
            data.get("eval_stats_before"),
            data.get("eval_stats_after"),
            None if trainer is None else int(trainer),
            BucketTiming.from_json(data),
        )


@dataclass
class StepRecord:
    """One (epoch, edge set, chunk) step, as committed (``"type": "step"``)."""

    at: Position
    stats: EdgeStats
    seconds: float = 0.0
    io_bytes_read: int = 0
    io_bytes_written: int = 0
    eval_before: Metrics | None = None
    eval_after: Metrics | None = None
    # distributed runs only
    net_bytes: int | None = None
    lock_waits: int | None = None
    trainers: int | None = None
    #: seconds the training thread waited for partitions to be read or written back
    io_wait_seconds: float | None = None
    # the run's kernel choice (bigembed.kernels.native.choice); None in older files
    kernel: str | None = None
    kernel_reason: str | None = None

    @property
    def edges_per_sec(self) -> float:
        return self.stats.count / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "step", **self.at.to_json(), "stats": self.stats.to_json()}
        out.update(_timing(self.stats, self.seconds))
        out.update(io_bytes_read=self.io_bytes_read, io_bytes_written=self.io_bytes_written)
        out.update(_evals(self.eval_before, self.eval_after))
        for key in ("net_bytes", "lock_waits", "trainers"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.io_wait_seconds is not None:
            out["io_wait_seconds"] = round(self.io_wait_seconds, 4)
        if self.kernel is not None:
            out.update(kernel=self.kernel, kernel_reason=self.kernel_reason)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        def opt(key: str) -> int | None:
            return None if data.get(key) is None else int(data[key])

        return cls(
            Position.from_json(data),
            EdgeStats.from_json(data["stats"]),
            float(data.get("seconds", 0.0)),
            int(data.get("io_bytes_read", 0)),
            int(data.get("io_bytes_written", 0)),
            data.get("eval_stats_before"),
            data.get("eval_stats_after"),
            opt("net_bytes"),
            opt("lock_waits"),
            opt("trainers"),
            None if data.get("io_wait_seconds") is None else float(data["io_wait_seconds"]),
            data.get("kernel"),
            data.get("kernel_reason"),
        )


@dataclass
class StepLog:
    """What one step adds to ``training_stats.json``: its bucket records, then its step record."""

    buckets: list[BucketRecord]
    step: StepRecord

    def to_json(self) -> list[dict[str, Any]]:
        return [*(b.to_json() for b in self.buckets), self.step.to_json()]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> StepLog:
        *buckets, step = data
        return cls([BucketRecord.from_json(b) for b in buckets], StepRecord.from_json(step))


def merge_step_logs(parts: Sequence[StepLog]) -> StepLog:
    """One log of a distributed step from every trainer's (``parts[r]`` is trainer ``r``'s).

    Bucket records are kept, tagged with their trainer; the step record adds edges, bytes and
    waits (``io_wait_seconds`` too: the sum over trainers, so divide by ``trainers`` for the
    mean), takes the slowest trainer's time and count-weights the means.
    """
    steps = [p.step for p in parts]
    waits = [s.io_wait_seconds for s in steps if s.io_wait_seconds is not None]

    def total(key: str) -> int:
        return sum(getattr(s, key) or 0 for s in steps)

    step = StepRecord(
        steps[0].at,
        EdgeStats.merge([s.stats for s in steps]),
        max(s.seconds for s in steps),
        total("io_bytes_read"),
        total("io_bytes_written"),
        _merge_metrics(s.eval_before for s in steps),
        _merge_metrics(s.eval_after for s in steps),
        net_bytes=total("net_bytes"),
        lock_waits=total("lock_waits"),
        trainers=len(parts),
        io_wait_seconds=sum(waits) if waits else None,
        **_merge_kernels(steps),
    )
    buckets = [replace(b, trainer=r) for r, p in enumerate(parts) for b in p.buckets]
    return StepLog(buckets, step)


def _merge_kernels(steps: Sequence[StepRecord]) -> dict[str, str | None]:
    """The kernel of a distributed step: ``native`` only if every trainer's was, else the
    first eager trainer's choice, its reason naming the trainer."""
    for rank, s in enumerate(steps):
        if s.kernel == "eager":
            return {"kernel": "eager", "kernel_reason": f"trainer {rank}: {s.kernel_reason}"}
    return {"kernel": steps[0].kernel, "kernel_reason": steps[0].kernel_reason}


@dataclass
class TrainingLog:
    """The records of a checkpoint directory's ``training_stats.json``, in file order."""

    buckets: list[BucketRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def buckets_of(self, version: int) -> list[BucketRecord]:
        return [b for b in self.buckets if b.at.version == version]


def parse_records(records: Iterable[dict[str, Any]], source: object = "") -> TrainingLog:
    """Typed records from JSON objects; a record that does not parse is skipped with a warning."""
    log = TrainingLog()
    skipped = 0
    for data in records:
        try:
            if data.get("type") == "bucket":
                log.buckets.append(BucketRecord.from_json(data))
            elif data.get("type") == "step":
                log.steps.append(StepRecord.from_json(data))
            else:
                skipped += 1
        except (KeyError, TypeError, ValueError, AttributeError):
            skipped += 1
    if skipped:
        logger.warning("%s: ignoring %d stats record(s) of an unknown form", source, skipped)
    return log


def read_training_log(store: CheckpointStore, max_version: int | None = None) -> TrainingLog:
    """The stats records of ``store`` (of versions up to ``max_version``)."""
    return parse_records(store.read_stats(max_version=max_version), store.path)
