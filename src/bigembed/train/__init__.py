"""``bigembed train``: the loop, the job, checkpoint policy, observers, records, iteration."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bigembed.train.hogwild.gate import BatchGate
    from bigembed.train.hogwild.malloc import keep_freed_memory
    from bigembed.train.iteration import Iteration, iterations
    from bigembed.train.job import ModelState, TrainingJob
    from bigembed.train.loop import StopTraining, TrainingLoop, TrainResult, standard_observers
    from bigembed.train.memory.cost import CostModel, bucket_costs
    from bigembed.train.memory.cost_calibration import BucketSample, fit_from_buckets
    from bigembed.train.memory.partitions import PartitionStore
    from bigembed.train.observers import BucketWork, Observer, TrainingObserver
    from bigembed.train.plotting import plot_training
    from bigembed.train.policy import checkpoint_metadata, commit_with_stats, resume
    from bigembed.train.records import (
        BucketRecord,
        StepLog,
        StepRecord,
        merge_step_logs,
        read_training_log,
    )
    from bigembed.train.single_machine import Trainer, train

#: Where each public name lives: imported on first use, so that a Hogwild worker importing
#: ``bigembed.train.hogwild.guard`` (standard library only) loads nothing heavy first.
_EXPORTS = {
    "BatchGate": "bigembed.train.hogwild.gate",
    "BucketRecord": "bigembed.train.records",
    "BucketSample": "bigembed.train.memory.cost_calibration",
    "BucketWork": "bigembed.train.observers",
    "CostModel": "bigembed.train.memory.cost",
    "Iteration": "bigembed.train.iteration",
    "ModelState": "bigembed.train.job",
    "Observer": "bigembed.train.observers",
    "PartitionStore": "bigembed.train.memory.partitions",
    "StepLog": "bigembed.train.records",
    "StepRecord": "bigembed.train.records",
    "StopTraining": "bigembed.train.loop",
    "TrainResult": "bigembed.train.loop",
    "Trainer": "bigembed.train.single_machine",
    "TrainingJob": "bigembed.train.job",
    "TrainingLoop": "bigembed.train.loop",
    "TrainingObserver": "bigembed.train.observers",
    "bucket_costs": "bigembed.train.memory.cost",
    "checkpoint_metadata": "bigembed.train.policy",
    "commit_with_stats": "bigembed.train.policy",
    "fit_from_buckets": "bigembed.train.memory.cost_calibration",
    "iterations": "bigembed.train.iteration",
    "keep_freed_memory": "bigembed.train.hogwild.malloc",
    "merge_step_logs": "bigembed.train.records",
    "plot_training": "bigembed.train.plotting",
    "read_training_log": "bigembed.train.records",
    "resume": "bigembed.train.policy",
    "standard_observers": "bigembed.train.loop",
    "train": "bigembed.train.single_machine",
}

__all__ = [
    "BatchGate",
    "BucketRecord",
    "BucketSample",
    "BucketWork",
    "CostModel",
    "Iteration",
    "ModelState",
    "Observer",
    "PartitionStore",
    "StepLog",
    "StepRecord",
    "StopTraining",
    "TrainResult",
    "Trainer",
    "TrainingJob",
    "TrainingLoop",
    "TrainingObserver",
    "bucket_costs",
    "checkpoint_metadata",
    "commit_with_stats",
    "fit_from_buckets",
    "iterations",
    "keep_freed_memory",
    "merge_step_logs",
    "plot_training",
    "read_training_log",
    "resume",
    "standard_observers",
    "train",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bigembed.train' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
