from .ann_build import (
    FLAT_MAX_ROWS,
    HNSW_MAX_ROWS,
    KINDS,
    BuildWatch,
    IndexKnobs,
    build_indexes,
)
from .ann_files import IndexInfo
from .errors import QueryError, UnknownNameError
from .examples import example_predictions
from .loader import load
from .model import EmbeddingModel, Prediction

__all__ = [
    "FLAT_MAX_ROWS",
    "HNSW_MAX_ROWS",
    "KINDS",
    "BuildWatch",
    "EmbeddingModel",
    "IndexInfo",
    "IndexKnobs",
    "Prediction",
    "QueryError",
    "UnknownNameError",
    "build_indexes",
    "example_predictions",
    "load",
]
