from .batch import BatchScores, Corruption, NegativeSettings, QueryBatch, SideEmbeddings
from .comparators import Comparator, CosComparator, DotComparator
from .dtype_choice import DtypeChoice, choose_compute_dtype
from .featurized import FeatureBags, normalise_bag_weights
from .names import (
    COMPARATOR_NAMES,
    COMPARATORS,
    COMPUTE_DTYPE_NAMES,
    COMPUTE_DTYPE_SETTINGS,
    COMPUTE_DTYPES,
    LOSS_NAMES,
    LOSSES,
    OPERATOR_MADDS,
    OPERATOR_NAMES,
    OPERATORS,
)
from .negatives import MASKED, batch_negative_unmasked
from .operators import DiagonalOperator, IdentityOperator, TranslationOperator
from .pbg_names import from_pbg, pbg_param_name, to_pbg
from .scoring import ScoringModel
from .spec import ModelSpec, RelationSpec

__all__ = [
    "COMPARATORS",
    "COMPARATOR_NAMES",
    "COMPUTE_DTYPES",
    "COMPUTE_DTYPE_NAMES",
    "COMPUTE_DTYPE_SETTINGS",
    "LOSSES",
    "LOSS_NAMES",
    "MASKED",
    "OPERATORS",
    "OPERATOR_MADDS",
    "OPERATOR_NAMES",
    "BatchScores",
    "Comparator",
    "Corruption",
    "CosComparator",
    "DiagonalOperator",
    "DotComparator",
    "DtypeChoice",
    "FeatureBags",
    "IdentityOperator",
    "ModelSpec",
    "NegativeSettings",
    "QueryBatch",
    "RelationSpec",
    "ScoringModel",
    "SideEmbeddings",
    "TranslationOperator",
    "batch_negative_unmasked",
    "choose_compute_dtype",
    "from_pbg",
    "normalise_bag_weights",
    "pbg_param_name",
    "to_pbg",
]
