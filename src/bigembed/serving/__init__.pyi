from .errors import QueryError, UnknownNameError
from .examples import example_predictions
from .loader import load
from .model import EmbeddingModel, Prediction

__all__ = [
    "EmbeddingModel",
    "Prediction",
    "QueryError",
    "UnknownNameError",
    "example_predictions",
    "load",
]
