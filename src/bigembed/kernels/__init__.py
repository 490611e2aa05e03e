"""How one batch is computed: the eager step, row Adagrad, whole-table updates, native kernels."""

from bigembed.kernels.native.eval import NativeEval
from bigembed.kernels.native.step import NativeStep
from bigembed.kernels.optimizers import row_adagrad_update
from bigembed.kernels.step import BatchTrainer, StepStats, Table

__all__ = ["BatchTrainer", "NativeEval", "NativeStep", "StepStats", "Table", "row_adagrad_update"]
