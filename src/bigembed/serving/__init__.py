"""A trained model answering queries: ``bigembed.load``, predict, similar, nearest neighbours."""

from bigembed.serving.errors import QueryError, UnknownNameError
from bigembed.serving.examples import example_predictions
from bigembed.serving.loader import load
from bigembed.serving.model import EmbeddingModel, Prediction

__all__ = [
    "EmbeddingModel",
    "Prediction",
    "QueryError",
    "UnknownNameError",
    "example_predictions",
    "load",
]
