"""How one batch is computed: the eager step, row Adagrad, whole-table updates, native kernels."""

from bigembed.kernels.native.build import (
    PACKAGE_DIR,
    NativeUnavailable,
    build_library,
    cache_dir,
    find_library,
)
from bigembed.kernels.native.choice import EAGER, KernelChoice, choose_kernel
from bigembed.kernels.native.eval import NativeEval
from bigembed.kernels.native.step import NativeStep
from bigembed.kernels.optimizers import row_adagrad_update
from bigembed.kernels.step import BatchTrainer, StepStats, Table

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
    "find_library",
    "row_adagrad_update",
]
