"""What a score is: operators, comparators, losses, negatives, the scoring model."""

from bigembed.model.comparators import Comparator, CosComparator, DotComparator
from bigembed.model.names import COMPARATOR_NAMES, COMPUTE_DTYPES, LOSS_NAMES, OPERATOR_NAMES
from bigembed.model.negatives import MASKED, batch_negative_unmasked
from bigembed.model.operators import DiagonalOperator, IdentityOperator, TranslationOperator
from bigembed.model.pbg_names import from_pbg, pbg_param_name, to_pbg
from bigembed.model.scoring import (
    BatchScores,
    Corruption,
    NegativeSettings,
    QueryBatch,
    ScoringModel,
    SideEmbeddings,
)
from bigembed.model.spec import ModelSpec, RelationSpec

__all__ = [
    "COMPARATOR_NAMES",
    "COMPUTE_DTYPES",
    "LOSS_NAMES",
    "MASKED",
    "OPERATOR_NAMES",
    "BatchScores",
    "Comparator",
    "Corruption",
    "CosComparator",
    "DiagonalOperator",
    "DotComparator",
    "IdentityOperator",
    "ModelSpec",
    "NegativeSettings",
    "QueryBatch",
    "RelationSpec",
    "ScoringModel",
    "SideEmbeddings",
    "TranslationOperator",
    "batch_negative_unmasked",
    "from_pbg",
    "pbg_param_name",
    "to_pbg",
]
