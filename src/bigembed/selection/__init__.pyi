from .early_stopping import EarlyStopping, Evaluation, train_model
from .tuning import Tuner

__all__ = ["EarlyStopping", "Evaluation", "Tuner", "train_model"]
