"""The training stats records: one typed record per bucket and per step, with one JSON form.

``training_stats.json`` (written by :meth:`bigembed.checkpoints.store.CheckpointStore.append_stats`)
holds one JSON object per line: the :class:`BucketRecord` lines of a step, then its
:class:`StepRecord` line (``"type": "bucket"`` / ``"type": "step"``). The records' fields are
their keys (:mod:`bigembed.serialization`): the training loop writes records,
:func:`merge_step_logs` merges the logs of the trainers of a distributed run, and
:func:`read_training_log` is the reader that ``bigembed plot``, ``bigembed train``'s summary and
the benchmarks use. A missing optional key takes its default, so files of earlier writers read.

Keys:

* both: ``version`` (the checkpoint version the step produced), ``epoch_idx``,
  ``edge_path_idx``, ``edge_chunk_idx``, ``stats`` (:class:`EdgeStats`: ``count`` edges and the
  per-edge means ``loss``, ``reg``, ``violators_lhs``, ``violators_rhs``), ``seconds``,
  ``edges_per_sec``, and, with ``eval_fraction > 0``, ``eval_stats_before`` /
  ``eval_stats_after`` (ranking metrics of the withheld edges, each with its ``count``);
* bucket: ``lhs_partition``, ``rhs_partition``, ``index`` (its place in the step), and in
  distributed runs ``trainer``; where the balance of work was measured (:class:`BucketTiming`):
  ``load_seconds`` (waiting for the bucket's partitions and edges), ``train_seconds`` (the
  Hogwild workers' wall time) and ``worker_seconds`` (each worker's busy time in it);
* step: ``io_bytes_read``, ``io_bytes_written``, ``io_wait_seconds``, and in distributed runs
  ``net_bytes``, ``lock_waits``, ``trainers``, and with a synchronous strategy
  ``gate_wait_seconds`` / ``peer_wait_seconds`` (with ``_by_trainer`` lists); ``kernel``
  (``native`` or ``eager``: the training step's path, decided once per run) and
  ``kernel_reason`` (why), absent from older files;
  ``compute_dtype`` (``float32`` or ``bfloat16``: the score products' dtype, decided once per
  run; ``mixed`` where a distributed run's trainers differ) and ``compute_dtype_reason``, absent
  from older files.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import field, replace
from typing import Any

from pydantic import (
    SerializerFunctionWrapHandler,
    computed_field,
    field_serializer,
    model_serializer,
    model_validator,
)
from pydantic.dataclasses import dataclass

from bigembed.checkpoints import CheckpointStore
from bigembed.serialization import RECORD_CONFIG, JsonForm, omit_none

logger = logging.getLogger(__name__)

Metrics = dict[str, Any]
"""Ranking metrics of withheld edges (``RankingSums.summary()``): count, mr, mrr, hits@k, ...
(``Any``: kept as given, so an integer count stays an integer on disk)."""


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


@dataclass(frozen=True, config=RECORD_CONFIG)
class EdgeStats(JsonForm):
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

    @staticmethod
    def merge(parts: Sequence[EdgeStats]) -> EdgeStats:
        """The stats of all the parts' edges (count-weighted means)."""
        return EdgeStats.from_json(weighted_mean([(p.count, p.to_json()) for p in parts]))


def _merge_metrics(parts: Iterable[Metrics | None]) -> Metrics | None:
    present = [(int(m["count"]), m) for m in parts if m is not None]
    return weighted_mean(present) if present else None


@dataclass(frozen=True, config=RECORD_CONFIG)
class Position(JsonForm):
    """Where a record belongs: the step's checkpoint version and its (epoch, edge set, chunk).

    On disk its keys are the record's own (see :func:`_flat`)."""

    version: int
    epoch_idx: int = 0
    edge_path_idx: int = 0
    edge_chunk_idx: int = 0


@dataclass(frozen=True, config=RECORD_CONFIG)
class BucketTiming(JsonForm):
    """Where a bucket's time went: the balance figures of ``bench/balance_bench.py``.

    On disk its keys are the bucket record's own, present together or not at all."""

    load_seconds: float = 0.0  # making its partitions resident and loading its edges
    train_seconds: float = 0.0  # the workers' wall time
    # each worker's busy time (the rest of train_seconds is idle)
    worker_seconds: list[float] = field(default_factory=list)


def _nested(data: Any, timing: bool = False) -> Any:
    """A record's JSON object with the keys of its :class:`Position` (and, for a bucket, of
    its :class:`BucketTiming`) gathered under ``at`` (``timing``); other input as it is."""
    if not isinstance(data, dict) or "at" in data:
        return data
    out = {**data, "at": data}
    if timing:
        out["timing"] = data if "train_seconds" in data else None
    return out


def _flat(kind: str, out: dict[str, Any]) -> dict[str, Any]:
    """The JSON object of a record: its type, the keys of ``at`` and ``timing``, then its own,
    ``edges_per_sec`` after ``seconds`` (the inverse of :func:`_nested`)."""
    at, timing = out.pop("at"), out.pop("timing", None) or {}
    rate = out.pop("edges_per_sec")
    flat = {"type": kind, **at, **timing}
    for key, value in out.items():
        flat[key] = value
        if key == "seconds":
            flat["edges_per_sec"] = rate
    return flat


@dataclass(config=RECORD_CONFIG)
class BucketRecord(JsonForm):
    """One bucket trained in one step (``"type": "bucket"``)."""

    at: Position
    lhs_partition: int
    rhs_partition: int
    index: int  # its place among the buckets this trainer trained in the step
    stats: EdgeStats
    seconds: float = 0.0
    eval_before: Metrics | None = omit_none(key="eval_stats_before")
    eval_after: Metrics | None = omit_none(key="eval_stats_after")
    trainer: int | None = omit_none()  # distributed runs: which trainer trained it
    timing: BucketTiming | None = omit_none()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def edges_per_sec(self) -> float:
        return self.stats.count / self.seconds if self.seconds > 0 else 0.0

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        data = _nested(data, timing=True)
        if isinstance(data, dict):
            data.setdefault("index", 0)
        return data

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _flat("bucket", handler(self))


@dataclass(config=RECORD_CONFIG)
class StepRecord(JsonForm):
    """One (epoch, edge set, chunk) step, as committed (``"type": "step"``)."""

    at: Position
    stats: EdgeStats
    seconds: float = 0.0
    io_bytes_read: int = 0
    io_bytes_written: int = 0
    eval_before: Metrics | None = omit_none(key="eval_stats_before")
    eval_after: Metrics | None = omit_none(key="eval_stats_after")
    # distributed runs only
    net_bytes: int | None = omit_none()
    lock_waits: int | None = omit_none()
    trainers: int | None = omit_none()
    #: seconds the training thread waited for partitions to be read or written back
    io_wait_seconds: float | None = omit_none()
    #: the run's kernel choice (bigembed.kernels.native.choice); absent from older files
    kernel: str | None = omit_none()
    kernel_reason: str | None = omit_none()
    #: the model's compute dtype (bigembed.model.dtype_choice) and why; absent from older files
    compute_dtype: str | None = omit_none()
    compute_dtype_reason: str | None = omit_none()
    #: distributed, synchronous strategies: seconds the workers waited at the strategy's gate
    #: (summed over workers and, merged, over trainers), and each trainer's share
    gate_wait_seconds: float | None = omit_none()
    gate_wait_by_trainer: list[float] | None = omit_none()
    #: of that wait, the seconds the gate stayed closed because another trainer had not reached
    #: the round yet (what the split of the edges between trainers decides; the rest is the
    #: round itself), summed over trainers, and each trainer's share
    peer_wait_seconds: float | None = omit_none()
    peer_wait_by_trainer: list[float] | None = omit_none()
    #: data-parallel runs: "data_parallel" (absent: partitioned or one machine)
    mode: str | None = omit_none()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def edges_per_sec(self) -> float:
        return self.stats.count / self.seconds if self.seconds > 0 else 0.0

    @field_serializer("io_wait_seconds", "gate_wait_seconds", "peer_wait_seconds")
    def _rounded(self, value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    @field_serializer("gate_wait_by_trainer", "peer_wait_by_trainer")
    def _rounded_list(self, value: list[float] | None) -> list[float] | None:
        return None if value is None else [round(v, 4) for v in value]

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        return _nested(data)

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _flat("step", handler(self))


@dataclass(config=RECORD_CONFIG)
class StepLog(JsonForm):
    """What one step adds to ``training_stats.json``: its bucket records, then its step record
    (on the wire and on disk a list, the step record last)."""

    buckets: list[BucketRecord]
    step: StepRecord

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        if isinstance(data, list) and data:
            return {"buckets": data[:-1], "step": data[-1]}
        return data

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> list[dict[str, Any]]:
        out = handler(self)
        return [*out["buckets"], out["step"]]


def _per_trainer(values: list[float | None]) -> list[float]:
    """Each trainer's figure (0 where one did not record it); empty when none did."""
    return [] if all(v is None for v in values) else [v or 0.0 for v in values]


def merge_step_logs(parts: Sequence[StepLog]) -> StepLog:
    """One log of a distributed step from every trainer's (``parts[r]`` is trainer ``r``'s).

    Bucket records are kept, tagged with their trainer; the step record adds edges, bytes and
    waits (``io_wait_seconds`` too: the sum over trainers, so divide by ``trainers`` for the
    mean), takes the slowest trainer's time and count-weights the means.
    """
    steps = [p.step for p in parts]
    waits = [s.io_wait_seconds for s in steps if s.io_wait_seconds is not None]
    gates = _per_trainer([s.gate_wait_seconds for s in steps])
    peers = _per_trainer([s.peer_wait_seconds for s in steps])

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
        gate_wait_seconds=sum(gates) if gates else None,
        gate_wait_by_trainer=gates if gates else None,
        peer_wait_seconds=sum(peers) if peers else None,
        peer_wait_by_trainer=peers if peers else None,
        mode=steps[0].mode,
        **_merge_kernels(steps),
        **_merge_dtypes(steps),
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


def _merge_dtypes(steps: Sequence[StepRecord]) -> dict[str, str | None]:
    """The compute dtype of a distributed step: the first trainer's, or, where trainers
    differ (machines with and without bf16 units), the first one that differs, named."""
    first = steps[0]
    for rank, s in enumerate(steps):
        if s.compute_dtype != first.compute_dtype:
            reason = f"trainer 0: {first.compute_dtype}; trainer {rank}: {s.compute_dtype_reason}"
            return {"compute_dtype": "mixed", "compute_dtype_reason": reason}
    return {
        "compute_dtype": first.compute_dtype,
        "compute_dtype_reason": first.compute_dtype_reason,
    }


@dataclasses.dataclass
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
