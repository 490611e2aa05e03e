from .native.eval import NativeEval
from .native.step import NativeStep
from .optimizers import row_adagrad_update
from .step import BatchTrainer, StepStats, Table

__all__ = ["BatchTrainer", "NativeEval", "NativeStep", "StepStats", "Table", "row_adagrad_update"]
