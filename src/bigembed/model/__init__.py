"""What a score is: operators, comparators, losses, negatives, the scoring model.

The names and :class:`ModelSpec` import no torch, so that reading a config stays light; the
torch-bound names are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bigembed.model.names import COMPARATOR_NAMES, COMPUTE_DTYPES, LOSS_NAMES, OPERATOR_NAMES
from bigembed.model.pbg_names import from_pbg, pbg_param_name, to_pbg
from bigembed.model.spec import ModelSpec, RelationSpec

if TYPE_CHECKING:
    from bigembed.model.batch import (
        BatchScores,
        Corruption,
        NegativeSettings,
        QueryBatch,
        SideEmbeddings,
    )
    from bigembed.model.comparators import Comparator, CosComparator, DotComparator
    from bigembed.model.negatives import MASKED, batch_negative_unmasked
    from bigembed.model.operators import DiagonalOperator, IdentityOperator, TranslationOperator
    from bigembed.model.scoring import ScoringModel

#: Where each torch-bound public name lives: imported on first use.
_LAZY = {
    "BatchScores": "bigembed.model.batch",
    "Comparator": "bigembed.model.comparators",
    "Corruption": "bigembed.model.batch",
    "CosComparator": "bigembed.model.comparators",
    "DiagonalOperator": "bigembed.model.operators",
    "DotComparator": "bigembed.model.comparators",
    "IdentityOperator": "bigembed.model.operators",
    "MASKED": "bigembed.model.negatives",
    "NegativeSettings": "bigembed.model.batch",
    "QueryBatch": "bigembed.model.batch",
    "ScoringModel": "bigembed.model.scoring",
    "SideEmbeddings": "bigembed.model.batch",
    "TranslationOperator": "bigembed.model.operators",
    "batch_negative_unmasked": "bigembed.model.negatives",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bigembed.model' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
