"""Early stopping: evaluate on validation edges every few epochs, keep the best version, stop.

:class:`EarlyStopping` is a training observer: after the commit of the last step of every
``early_stopping.every``-th epoch (and of the last epoch) it evaluates the committed checkpoint
on ``early_stopping.valid_path`` with the eval package (filtered full ranking, or sampled),
records the result in ``validation_stats.json``, keeps the version in ``best/`` when it beats
the best so far by more than ``min_delta``, and ends training (:class:`StopTraining`) after
``patience`` evaluations in a row without such a gain. Its state is rebuilt from
``validation_stats.json`` on resume, so a killed run continues counting where it was and a
stopped run stays stopped.

It lives above ``train`` and ``eval`` (which may not import each other) and composes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigembed.checkpoints import CheckpointStore
from bigembed.config import ConfigSchema, EarlyStoppingSchema
from bigembed.errors import ConfigError, InputError
from bigembed.train import (
    Observer,
    StepRecord,
    StopTraining,
    Trainer,
    TrainingObserver,
    TrainResult,
    training_locks,
)

logger = logging.getLogger(__name__)

OnEvaluation = Callable[["Evaluation"], None]
"""Called after each evaluation is recorded; may raise StopTraining (a pruned trial)."""


@dataclass
class Evaluation:
    """One validation evaluation, as recorded in ``validation_stats.json``."""

    version: int
    epoch: int  # epochs completed
    metric: str
    value: float
    metrics: dict[str, float]
    best_version: int
    best_value: float
    without_gain: int
    stop: bool
    protocol: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "epoch": self.epoch,
            "metric": self.metric,
            "value": self.value,
            "metrics": self.metrics,
            "best_version": self.best_version,
            "best_value": self.best_value,
            "without_gain": self.without_gain,
            "stop": self.stop,
            "protocol": self.protocol,
            "seconds": round(self.seconds, 3),
        }

    def line(self, patience: int) -> str:
        kind = "filtered, full ranking" if self.protocol == "full" else "raw, sampled negatives"
        gain = (
            "new best"
            if self.without_gain == 0
            else f"best {self.best_value:.4f} at version {self.best_version}; "
            f"{self.without_gain}/{patience} without gain"
        )
        return (
            f"validation after epoch {self.epoch} ({kind}): {self.metric} {self.value:.4f} ({gain})"
        )


class EarlyStopping(Observer):
    """The observer (see the module docstring). ``steps_per_epoch``: committed versions per
    epoch (edge paths x edge chunks)."""

    def __init__(
        self,
        cfg: ConfigSchema,
        steps_per_epoch: int,
        *,
        report: Callable[[str], None] | None = None,
        on_evaluation: OnEvaluation | None = None,
        progress: bool = False,
    ) -> None:
        assert cfg.early_stopping is not None
        self.cfg = cfg
        self.es: EarlyStoppingSchema = cfg.early_stopping
        self.steps_per_epoch = steps_per_epoch
        self.report = report
        self.on_evaluation = on_evaluation
        self.progress = progress
        self.store = CheckpointStore(cfg.checkpoint_path)
        self.best_value: float | None = None
        self.best_version = 0
        self.without_gain = 0
        self.stopped: str | None = None
        self.evaluated: set[int] = set()

    # ------------------------------------------------------------------ state
    def restore(self, committed: int) -> None:
        """Rebuild the counters from the records of versions up to ``committed``."""
        for record in self.store.read_validation(max_version=committed):
            self.evaluated.add(int(record["version"]))
            self.best_version = int(record.get("best_version", 0))
            self.best_value = float(record.get("best_value", 0.0))
            self.without_gain = int(record.get("without_gain", 0))
            if record.get("stop"):
                self.stopped = self._reason()
            else:
                self.stopped = None

    def _reason(self) -> str:
        return (
            f"early stopping: validation {self.es.metric} did not improve for "
            f"{self.es.patience} evaluation(s); best {self.best_value:.4f} at version "
            f"{self.best_version}, kept in {self.store.path / 'best'}"
        )

    def due(self, version: int) -> bool:
        """Whether committed ``version`` ends an epoch that is evaluated."""
        if version <= 0 or version % self.steps_per_epoch:
            return False
        epoch = version // self.steps_per_epoch
        return epoch % self.es.every == 0 or epoch >= self.cfg.num_epochs

    # ------------------------------------------------------------------ observer
    def step_committed(self, record: StepRecord) -> None:
        if self.due(record.at.version):
            self.evaluate(record.at.version)

    def start(self, committed: int) -> str | None:
        """Before training resumes after version ``committed``: rebuild the counters, evaluate
        ``committed`` if a killed run did not get to it; returns why the run is over already
        (a stopped run stays stopped), or None to train."""
        check_valid_path(self.cfg)
        self.restore(committed)
        try:
            self.catch_up(committed)
        except StopTraining as stop:
            return str(stop)
        return self.stopped

    def catch_up(self, committed: int) -> None:
        """Evaluate ``committed`` if it is due and a killed run did not get to it."""
        if self.due(committed) and committed not in self.evaluated and self.stopped is None:
            self.evaluate(committed)

    def evaluate(self, version: int) -> Evaluation:
        from bigembed.eval import evaluate_checkpoint

        es = self.es
        started = time.perf_counter()
        full = es.protocol == "full"
        filters: Sequence[str] | None = None
        if full and es.filter_paths is not None:
            filters = es.filter_paths
        result = evaluate_checkpoint(
            self.cfg,
            [es.valid_path],
            filters,
            filtered=full,
            protocol=es.protocol,
            progress=self.progress,
        )
        metrics = result.headline or {}
        value = float(metrics[es.metric])
        if self.best_value is None or value > self.best_value + es.min_delta:
            self.best_value, self.best_version, self.without_gain = value, version, 0
            self.store.save_best(
                version,
                {
                    "epoch": version // self.steps_per_epoch,
                    "metric": es.metric,
                    "value": value,
                    "protocol": es.protocol,
                    "valid_path": es.valid_path,
                },
            )
        else:
            self.without_gain += 1
        stop = self.without_gain >= es.patience
        evaluation = Evaluation(
            version=version,
            epoch=version // self.steps_per_epoch,
            metric=es.metric,
            value=value,
            metrics={k: float(v) for k, v in metrics.items()},
            best_version=self.best_version,
            best_value=float(self.best_value),
            without_gain=self.without_gain,
            stop=stop,
            protocol=es.protocol,
            seconds=time.perf_counter() - started,
        )
        self.store.append_validation(evaluation.to_dict())
        self.evaluated.add(version)
        if self.report is not None:
            self.report(evaluation.line(es.patience))
        if self.on_evaluation is not None:
            self.on_evaluation(evaluation)
        if stop:
            self.stopped = self._reason()
            if version < self.cfg.num_epochs * self.steps_per_epoch:  # else it ends anyway
                raise StopTraining(self.stopped)
        return evaluation


def check_valid_path(cfg: ConfigSchema) -> None:
    """The validation edges of ``early_stopping`` exist (if the config has the section)."""
    if cfg.early_stopping is not None and not Path(cfg.early_stopping.valid_path).exists():
        raise InputError(
            f"early_stopping.valid_path: {cfg.early_stopping.valid_path}: no such edge path or "
            "file (import the validation edges, or give a file of names)"
        )


def train_model(
    cfg: ConfigSchema,
    *,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
    observers: Sequence[TrainingObserver] = (),
    on_evaluation: OnEvaluation | None = None,
    rank: int | None = None,
) -> TrainResult:
    """Train as the config says, with early stopping when it has an ``early_stopping``
    section (otherwise exactly :func:`bigembed.train.single_machine.train`). The checkpoint is
    held for the whole run, early stopping's evaluations included (``training_locks``).

    With ``num_machines > 1`` this process is trainer ``rank`` of the distributed run
    (:func:`bigembed.distributed.train_distributed`, which takes the locks; ``observers`` and
    ``on_evaluation`` are for one machine only): rank 0 evaluates and decides, every trainer
    stops with it."""
    if cfg.num_machines > 1:
        if rank is None or observers or on_evaluation is not None:  # e.g. a tune trial
            raise ConfigError(
                f"num_machines: {cfg.num_machines}: only bigembed train --rank R (or bigembed "
                "launch) trains on several machines; set num_machines: 1 here"
            )
        return _train_distributed(cfg, rank, progress, report)
    check_valid_path(cfg)
    with training_locks(cfg):
        return _train_model(
            cfg, progress=progress, report=report, observers=observers, on_evaluation=on_evaluation
        )


def _train_model(
    cfg: ConfigSchema,
    *,
    progress: bool,
    report: Callable[[str], None] | None,
    observers: Sequence[TrainingObserver],
    on_evaluation: OnEvaluation | None,
) -> TrainResult:
    trainer = Trainer(cfg, progress=progress, report=report, observers=observers)
    if cfg.early_stopping is None:
        return trainer.train()
    steps_per_epoch = len(cfg.edge_paths) * trainer.job.num_chunks
    stopper = EarlyStopping(
        cfg, steps_per_epoch, report=report, on_evaluation=on_evaluation, progress=progress
    )
    committed = CheckpointStore(cfg.checkpoint_path).committed_version()
    stopped = stopper.start(committed)
    if stopped is not None:
        return TrainResult(version=committed, steps_run=0, stopped=stopped)
    trainer.observers.append(stopper)
    return trainer.train()


def _train_distributed(
    cfg: ConfigSchema, rank: int, progress: bool, report: Callable[[str], None] | None
) -> TrainResult:
    """Trainer ``rank`` of a distributed run; rank 0 holds the early-stopping rule (it always
    sees the committed checkpoint), run after each commit and shared with every trainer."""
    from bigembed.distributed import train_distributed

    def rule(steps_per_epoch: int) -> EarlyStopping:
        return EarlyStopping(cfg, steps_per_epoch, report=report, progress=progress)

    return train_distributed(cfg, rank=rank, progress=progress, report=report, stop_rule=rule)
