from .growth import Growth, frozen_rows, grow_checkpoint, pending_extension
from .hogwild.gate import BatchGate
from .hogwild.malloc import keep_freed_memory
from .iteration import Iteration, iterations
from .job import ModelState, TrainingJob
from .loop import StopTraining, TrainingLoop, TrainResult, standard_observers
from .memory.cost import CostModel, bucket_costs
from .memory.cost_calibration import BucketSample, fit_from_buckets
from .memory.partition_values import init_embeddings
from .memory.partitions import PartitionStore
from .observers import BucketWork, Observer, TrainingObserver
from .plotting import plot_training
from .policy import checkpoint_metadata, commit_with_stats, resume
from .records import BucketRecord, StepLog, StepRecord, merge_step_logs, read_training_log
from .replica_share import ReplicaShare
from .single_machine import Trainer, train, training_locks

__all__ = [
    "BatchGate",
    "BucketRecord",
    "BucketSample",
    "BucketWork",
    "CostModel",
    "Growth",
    "Iteration",
    "ModelState",
    "Observer",
    "PartitionStore",
    "ReplicaShare",
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
    "frozen_rows",
    "grow_checkpoint",
    "init_embeddings",
    "iterations",
    "keep_freed_memory",
    "merge_step_logs",
    "pending_extension",
    "plot_training",
    "read_training_log",
    "resume",
    "standard_observers",
    "train",
    "training_locks",
]
