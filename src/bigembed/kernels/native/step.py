"""The native training step: one call of ``native_step.cpp`` per batch where it applies.

For small-dimension work (d=100, 50 batch + 50 uniform negatives, PBG's defaults) the eager
step is ~100 small torch operations on 1000 x 100 tensors, and their dispatch, autograd and
memory passes cost more than the products. The kernel does the same step (gathers, operator,
comparator, loss, backward, row Adagrad in place) in one call with register-blocked products,
on one thread (a Hogwild worker's).

It applies to a batch when (else the eager path, the reference, runs):

* standard relations (not ``dynamic_relations``), the relation's operator ``none``,
  ``translation`` or ``diagonal``, ``all_negs`` off, not a grouped-query (KvsAll) batch;
* comparator ``dot`` or ``cos`` without ``bias``, loss ``ranking``, ``softmax`` or
  ``logistic``, ``compute_dtype: float32``;
* ``regularization_coef: 0``, no ``max_norm``, no ``entity_dropout``/``relation_dropout``;
* uniform negatives (``num_uniform_negs > 0``), at most :data:`MAX_NEGATIVES` negatives per
  positive and dimension at most :data:`MAX_DIMENSION` (beyond that torch's products, on
  more threads, are the better choice);
* the native library could be built (:mod:`bigembed.kernels.native.build`; ``BIGEMBED_NATIVE=0``
  turns it off).

Results match the eager step to float rounding (tests/test_native_step.py): the products and
sums run in another order, nothing else differs, and uniform negatives are drawn from the same
generator calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from bigembed.buckets import Batch, draw_uniform
from bigembed.kernels.native.build import native_library
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

#: The kernels' code of each loss (``loss_kind`` of StepArgs and EvalArgs).
NATIVE_LOSS_KINDS = {"softmax": 0, "ranking": 1, "logistic": 2}
_OPERATOR_KINDS = {IdentityOperator: 0, TranslationOperator: 1, DiagonalOperator: 2}

_P = ctypes.c_void_p
_I = ctypes.c_int64
_D = ctypes.c_double


class _Args(ctypes.Structure):
    """``StepArgs`` of native_step.cpp, field for field."""

    _fields_ = [
        *((name, _P) for name in ("lhs_emb", "lhs_state", "rhs_emb", "rhs_state")),
        *((name, _P) for name in ("lhs_idx", "rhs_idx", "lhs_uidx", "rhs_uidx")),
        *((name, _P) for name in ("weight", "op_param", "op_grad")),
        *((name, _P) for name in ("lhs_glob", "rhs_glob", "lhs_glob_grad", "rhs_glob_grad")),
        *((name, _I) for name in ("lhs_rows", "rhs_rows", "dim", "batch", "num_batch_negs")),
        *((name, _I) for name in ("num_uniform", "uniform_group", "cos", "loss_kind")),
        *((name, _I) for name in ("op_kind", "enable_lhs", "enable_rhs", "shared_table")),
        *((name, _D) for name in ("margin", "rel_weight", "lr", "loss")),
        ("violators_lhs", _I),
        ("violators_rhs", _I),
    ]


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


def _model_supported(model: ScoringModel, negs: NegativeSettings) -> bool:
    spec = model.spec
    return (
        not model.dynamic
        and model.fusable_loss
        and model.compute_dtype == torch.float32
        and model.reg_coef == 0
        and not model.dropout
        and spec.max_norm is None
        and negs.num_uniform_negs > 0
        and negs.num_uniform_negs + negs.num_batch_negs <= MAX_NEGATIVES
        and not (negs.disable_lhs and negs.disable_rhs)
    )


class NativeStep:
    """The kernel bound to one model and its negative settings (one per :class:`BatchTrainer`)."""

    def __init__(self, lib: ctypes.CDLL, model: ScoringModel, negs: NegativeSettings) -> None:
        self.lib = lib
        self.model = model
        self.negs = negs
        self.cos = isinstance(model.comparator, CosComparator)
        self.loss_kind = NATIVE_LOSS_KINDS[model.spec.loss]
        self.margin = float(model.spec.margin)
        self._relations: dict[int, _Relation | None] = {}

    @classmethod
    def for_model(cls, model: ScoringModel, negs: NegativeSettings) -> NativeStep | None:
        """The kernel for this model, or None when no batch of it can use the kernel."""
        if not _model_supported(model, negs):
            return None
        lib = native_library()
        if lib is None:
            return None
        native = cls(lib, model, negs)
        if all(native._relation(i) is None for i in range(len(model.spec.relations))):
            return None  # no relation has an operator the kernel knows (or all use all_negs)
        return native

    @staticmethod
    def prepare(model: ScoringModel, negs: NegativeSettings) -> bool:
        """Build (or find cached) the kernel now if this model can use it: called by the trainer
        before its Hogwild workers start, so they only load it. True when it is ready."""
        return NativeStep.for_model(model, negs) is not None

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

        args = _Args(
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
