from .featurized_rows import entity_table
from .native.build import PACKAGE_DIR, NativeUnavailable, build_library, cache_dir, find_library
from .native.choice import EAGER, KernelChoice, choose_kernel
from .native.eval import NativeEval
from .native.step import NativeStep
from .optimizers import row_adagrad_update
from .step import BatchTrainer, StepStats, Table

__all__ = [
    "EAGER",
    "PACKAGE_DIR",
    "BatchTrainer",
    "KernelChoice",
    "NativeEval",
    "NativeStep",
    "NativeUnavailable",
    "StepStats",
    "Table",
    "build_library",
    "cache_dir",
    "choose_kernel",
    "entity_table",
    "find_library",
    "row_adagrad_update",
]
