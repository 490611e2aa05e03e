"""What a score is: operators, comparators, losses, negatives, the scoring model.

The registries of names (:mod:`bigembed.model.names`) and the model's description
(:mod:`bigembed.model.spec`) load eagerly and import no torch, so that validating a config
stays fast; every other export is imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bigembed.model.names import (
    COMPARATOR_NAMES,
    COMPARATORS,
    COMPUTE_DTYPE_NAMES,
    COMPUTE_DTYPES,
    LOSS_NAMES,
    LOSSES,
    OPERATOR_NAMES,
    OPERATORS,
)
from bigembed.model.spec import ModelSpec, RelationSpec

if TYPE_CHECKING:
    from bigembed.model.comparators import Comparator, CosComparator, DotComparator
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

#: Where each lazily loaded name lives.
_EXPORTS = {
    "BatchScores": "bigembed.model.scoring",
    "Comparator": "bigembed.model.comparators",
    "Corruption": "bigembed.model.scoring",
    "CosComparator": "bigembed.model.comparators",
    "DiagonalOperator": "bigembed.model.operators",
    "DotComparator": "bigembed.model.comparators",
    "IdentityOperator": "bigembed.model.operators",
    "MASKED": "bigembed.model.negatives",
    "NegativeSettings": "bigembed.model.scoring",
    "QueryBatch": "bigembed.model.scoring",
    "ScoringModel": "bigembed.model.scoring",
    "SideEmbeddings": "bigembed.model.scoring",
    "TranslationOperator": "bigembed.model.operators",
    "batch_negative_unmasked": "bigembed.model.negatives",
    "from_pbg": "bigembed.model.pbg_names",
    "pbg_param_name": "bigembed.model.pbg_names",
    "to_pbg": "bigembed.model.pbg_names",
}

__all__ = [
    "COMPARATORS",
    "COMPARATOR_NAMES",
    "COMPUTE_DTYPES",
    "COMPUTE_DTYPE_NAMES",
    "LOSSES",
    "LOSS_NAMES",
    "MASKED",
    "OPERATORS",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
