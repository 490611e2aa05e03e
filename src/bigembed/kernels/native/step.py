"""The native training step: one call of ``native_step.cpp`` per batch where it applies.

For small dimensions the eager step is about a hundred small torch operations per batch, whose
dispatch, autograd and memory passes cost more than the products themselves. The kernel does
the same step (gathers, operator, comparator, loss, backward, row Adagrad in place) in one call
with register-blocked products, on one thread (a Hogwild worker's).

It applies to a batch when (else the eager path, the reference, runs):

* standard relations (not ``dynamic_relations``), the relation's operator ``none``,
  ``translation`` or ``diagonal``, ``all_negs`` off, not a grouped-query (KvsAll) batch;
* comparator ``dot`` or ``cos`` without ``bias``, loss ``ranking``, ``softmax`` or
  ``logistic``, ``compute_dtype: float32``;
* ``regularization_coef: 0``, no ``max_norm``, no ``entity_dropout``/``relation_dropout``;
* uniform negatives (``num_uniform_negs > 0``), at most :data:`MAX_NEGATIVES` negatives per
  positive and dimension at most :data:`MAX_DIMENSION` (beyond that torch's products, on
  more threads, are the better choice).

The query entity as a negative (``self_negative``) is one more column of each side's scores,
as in the eager path.

Whether a run uses it at all is decided once, by the trainer
(:mod:`bigembed.kernels.native.choice`); :func:`unsupported` gives the model-level reason when
it cannot. Results match the eager step to float rounding (tests/test_native_step.py): the
products and sums run in another order, nothing else differs, and uniform negatives are drawn
from the same generator calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from bigembed.buckets import Batch, draw_uniform
from bigembed.kernels.native.abi import LOSS_KINDS, OPERATOR_KINDS, StepArgs
from bigembed.model import (
    CosComparator,
    DiagonalOperator,
    IdentityOperator,
    NegativeSettings,
    ScoringModel,
    TranslationOperator,
)

#: Negatives per positive (batch + uniform) above which the eager path runs.
MAX_NEGATIVES = 512
#: Embedding dimension above which the eager path runs.
MAX_DIMENSION = 512

_OPERATOR_KINDS = {
    IdentityOperator: OPERATOR_KINDS["none"],
    TranslationOperator: OPERATOR_KINDS["translation"],
    DiagonalOperator: OPERATOR_KINDS["diagonal"],
}


@dataclass(frozen=True)
class _Relation:
    """What the kernel needs of one relation: its operator's kind and parameter, its weight,
    the global embeddings of its two entity types (None without ``global_emb``)."""

    op_kind: int
    param: Tensor | None
    weight: float
    lhs_glob: Tensor | None
    rhs_glob: Tensor | None


@dataclass(frozen=True)
class NativeResult:
    loss: float
    violators_lhs: int
    violators_rhs: int


def relation_plan(model: ScoringModel, idx: int) -> _Relation | None:
    """What the kernels need of relation ``idx`` of a standard-mode model, or None when its
    operator is not one they know or it ranks against all entities (``all_negs``)."""
    rspec = model.relation_spec(idx)
    op = model.rhs_operator(idx)
    kind = _OPERATOR_KINDS.get(type(op))
    if kind is None or rspec.all_negs:
        return None
    param = None
    if isinstance(op, TranslationOperator):
        param = op.translation
    elif isinstance(op, DiagonalOperator):
        param = op.diagonal
    globs = model.global_embs
    return _Relation(kind, param, float(rspec.weight), globs.get(rspec.lhs), globs.get(rspec.rhs))


def scoring_unsupported(model: ScoringModel) -> str | None:
    """Why neither kernel can score this model (the step's and the eval's common part), in
    the config's words; None when they can."""
    spec = model.spec
    if model.dynamic:
        return "dynamic_relations: true is not supported natively"
    if not model.fusable_loss:
        comparator = f"{spec.comparator} with bias" if spec.bias else spec.comparator
        return f"comparator {comparator} with loss_fn {spec.loss} is not supported natively"
    if model.compute_dtype != torch.float32:
        chosen = model.dtype_choice.name
        setting = chosen if spec.compute_dtype == chosen else f"{spec.compute_dtype} ({chosen})"
        return f"compute_dtype: {setting} is not supported natively"
    return None


def unsupported(model: ScoringModel, negs: NegativeSettings) -> str | None:
    """Why no batch of this model can take the native step, in the config's words (checked
    once per run by the trainer); None when some can."""
    spec = model.spec
    total = negs.num_uniform_negs + negs.num_batch_negs
    reasons = [
        (model.reg_coef != 0, "regularization_coef > 0"),
        (model.dropout, "entity_dropout / relation_dropout"),
        (spec.max_norm is not None, "max_norm"),
        (negs.num_uniform_negs == 0, "num_uniform_negs: 0"),
        (total > MAX_NEGATIVES, f"{total} negatives per edge > native max {MAX_NEGATIVES}"),
        (negs.disable_lhs and negs.disable_rhs, "disable_lhs_negs and disable_rhs_negs"),
    ]
    common = scoring_unsupported(model)
    if common is not None:
        return common
    for failed, what in reasons:
        if failed:
            return f"{what} is not supported natively"
    planned = [i for i in range(len(spec.relations)) if relation_plan(model, i) is not None]
    if not planned:
        if all(r.all_negs for r in spec.relations):
            return "all_negs on every relation is not supported natively"
        operators = ", ".join(sorted({r.operator for r in spec.relations}))
        return f"operator {operators} is not supported natively"
    dims = [
        (spec.dimension(spec.relations[i].lhs), spec.dimension(spec.relations[i].rhs))
        for i in planned
    ]
    if not any(lhs == rhs <= MAX_DIMENSION for lhs, rhs in dims):
        return f"dimension {max(max(d) for d in dims)} > native max {MAX_DIMENSION}"
    return None


class NativeStep:
    """The kernel bound to one model and its negative settings (one per :class:`BatchTrainer`)."""

    def __init__(self, lib: ctypes.CDLL, model: ScoringModel, negs: NegativeSettings) -> None:
        self.lib = lib
        self.model = model
        self.negs = negs
        self.cos = isinstance(model.comparator, CosComparator)
        self.loss_kind = LOSS_KINDS[model.spec.loss]
        self.margin = float(model.spec.margin)
        self._relations: dict[int, _Relation | None] = {}

    @classmethod
    def for_model(
        cls, model: ScoringModel, negs: NegativeSettings, lib: ctypes.CDLL
    ) -> NativeStep | None:
        """The kernel of ``lib`` for this model, or None when no batch of it can use it."""
        return None if unsupported(model, negs) is not None else cls(lib, model, negs)

    def _relation(self, idx: int) -> _Relation | None:
        if idx not in self._relations:
            self._relations[idx] = relation_plan(self.model, idx)
        return self._relations[idx]

    def step(
        self,
        batch: Batch,
        lhs_emb: Tensor,
        lhs_state: Tensor,
        rhs_emb: Tensor,
        rhs_state: Tensor,
        gen: torch.Generator,
        lr: float,
    ) -> NativeResult | None:
        """Train on ``batch`` in place (tables, states, the operator's ``.grad``); None (and
        nothing drawn or changed) when the batch is outside what the kernel supports."""
        rel = self._relation(batch.relation_idx)
        dim = lhs_emb.shape[1]
        if (
            rel is None
            or batch.side != "both"
            or rhs_emb.shape[1] != dim
            or dim > MAX_DIMENSION
            or not all(
                t.dtype == torch.float32 and t.is_contiguous()
                for t in (lhs_emb, lhs_state, rhs_emb, rhs_state)
            )
        ):
            return None
        negs = self.negs
        size = len(batch)
        lhs_uidx = draw_uniform(lhs_emb.shape[0], size, negs, False, gen)
        rhs_uidx = draw_uniform(rhs_emb.shape[0], size, negs, False, gen)
        assert lhs_uidx is not None and rhs_uidx is not None  # num_uniform_negs > 0
        keep = [batch.lhs.long().contiguous(), batch.rhs.long().contiguous(), lhs_uidx, rhs_uidx]
        weight = None
        if batch.weight is not None:
            weight = batch.weight.float().contiguous()
            keep.append(weight)
        params = [rel.param, rel.lhs_glob, rel.rhs_glob]
        values = [None if p is None else p.detach().contiguous() for p in params]
        grads = [None if p is None else torch.zeros_like(p) for p in params]
        if rel.lhs_glob is not None and rel.lhs_glob is rel.rhs_glob:
            grads[2] = grads[1]  # one entity type on both sides: one gradient

        def ptr(t: Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        args = StepArgs(
            lhs_emb.data_ptr(),
            lhs_state.data_ptr(),
            rhs_emb.data_ptr(),
            rhs_state.data_ptr(),
            *(t.data_ptr() for t in keep[:4]),
            ptr(weight),
            ptr(values[0]),
            ptr(grads[0]),
            ptr(values[1]),
            ptr(values[2]),
            ptr(grads[1]),
            ptr(grads[2]),
            lhs_emb.shape[0],
            rhs_emb.shape[0],
            dim,
            size,
            negs.num_batch_negs,
            negs.num_uniform_negs,
            negs.uniform_group,
            int(self.cos),
            self.loss_kind,
            rel.op_kind,
            int(not negs.disable_lhs),
            int(not negs.disable_rhs),
            int(lhs_emb is rhs_emb),
            int(self.model.self_negative(negs, batch.relation_idx)),
            self.margin,
            rel.weight,
            lr,
            0.0,
            0,
            0,
        )
        self.lib.bigembed_native_step(ctypes.byref(args))
        for param, grad in zip(params, grads, strict=True):
            if param is not None:
                param.grad = grad
        return NativeResult(float(args.loss), int(args.violators_lhs), int(args.violators_rhs))
