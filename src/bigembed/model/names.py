"""The registries of the model's building blocks: each name and where it is implemented.

Each :class:`~bigembed.registry.Registry` holds THE list of valid names of its kind, in
documentation order; the config derives its allowed values from them
(:mod:`bigembed.config.types`). This module imports no implementation, so validating a config
does not load torch (``bigembed import`` and ``bigembed config`` stay fast); a name's module is
imported when the model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from bigembed.registry import Registry

if TYPE_CHECKING:
    import torch

    from bigembed.model.comparators import Comparator
    from bigembed.model.losses import LossFactory
    from bigembed.model.operators import Operator

_OPS = "bigembed.model.operators"
_CMP = "bigembed.model.comparators"
_LOSS = "bigembed.model.losses"

#: Relation operators (transforms of one side's embeddings).
OPERATORS: Registry[type[Operator]] = Registry(
    "operator",
    [
        ("none", f"{_OPS}:IdentityOperator"),
        ("translation", f"{_OPS}:TranslationOperator"),
        ("diagonal", f"{_OPS}:DiagonalOperator"),
        ("linear", f"{_OPS}:LinearOperator"),
        ("affine", f"{_OPS}:AffineOperator"),
        ("complex_diagonal", f"{_OPS}:ComplexDiagonalOperator"),
    ],
)
#: Multiply-adds of each operator applied to one embedding of dimension ``d`` (forward; the
#: backward is proportional): what the cost models of training and evaluation charge for it.
OPERATOR_MADDS: dict[str, Callable[[int], int]] = {
    "none": lambda d: 0,
    "translation": lambda d: d,
    "diagonal": lambda d: d,
    "complex_diagonal": lambda d: 2 * d,
    "linear": lambda d: d * d,
    "affine": lambda d: d * d + d,
}
#: Comparators (similarity of two embeddings).
COMPARATORS: Registry[type[Comparator]] = Registry(
    "comparator",
    [
        ("dot", f"{_CMP}:DotComparator"),
        ("cos", f"{_CMP}:CosComparator"),
        ("l2", f"{_CMP}:L2Comparator"),
        ("squared_l2", f"{_CMP}:SquaredL2Comparator"),
    ],
)
#: Losses over a positive score and its negatives, each made from the margin (only the ranking
#: loss uses it).
LOSSES: Registry[LossFactory] = Registry(
    "loss",
    [
        ("ranking", f"{_LOSS}:RankingLoss"),
        ("logistic", f"{_LOSS}:logistic"),
        ("softmax", f"{_LOSS}:softmax"),
    ],
)
#: Compute dtypes of the scoring matrix products (parameters stay float32).
COMPUTE_DTYPES: Registry[torch.dtype] = Registry(
    "compute dtype", [("float32", "torch:float32"), ("bfloat16", "torch:bfloat16")]
)

OPERATOR_NAMES: tuple[str, ...] = OPERATORS.names
COMPARATOR_NAMES: tuple[str, ...] = COMPARATORS.names
LOSS_NAMES: tuple[str, ...] = LOSSES.names
COMPUTE_DTYPE_NAMES: tuple[str, ...] = COMPUTE_DTYPES.names
#: What the config's ``compute_dtype`` accepts: a dtype, or ``auto`` (decided per machine by
#: :mod:`bigembed.model.dtype_choice`).
COMPUTE_DTYPE_SETTINGS: tuple[str, ...] = ("auto", *COMPUTE_DTYPE_NAMES)

__all__: list[str] = [
    "COMPARATORS",
    "COMPARATOR_NAMES",
    "COMPUTE_DTYPES",
    "COMPUTE_DTYPE_NAMES",
    "COMPUTE_DTYPE_SETTINGS",
    "LOSSES",
    "LOSS_NAMES",
    "OPERATORS",
    "OPERATOR_NAMES",
]
