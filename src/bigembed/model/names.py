"""The names of the model's building blocks: one registry of names per kind.

Each tuple is THE list of valid names: :mod:`bigembed.model.operators`,
:mod:`bigembed.model.comparators` and :mod:`bigembed.model.losses` pair exactly these names with
their implementations, and the config derives its allowed
values from them (:mod:`bigembed.config.types`). This module imports nothing, so validating a
config does not load torch (``bigembed import`` and ``bigembed config`` stay fast).
"""

from __future__ import annotations

#: Relation operators (transforms of one side's embeddings), in documentation order.
OPERATOR_NAMES: tuple[str, ...] = (
    "none",
    "translation",
    "diagonal",
    "linear",
    "affine",
    "complex_diagonal",
)
#: Comparators (similarity of two embeddings).
COMPARATOR_NAMES: tuple[str, ...] = ("dot", "cos", "l2", "squared_l2")
#: Losses over a positive score and its negatives.
LOSS_NAMES: tuple[str, ...] = ("ranking", "logistic", "softmax")
#: Compute dtypes of the scoring matrix products (parameters stay float32).
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
