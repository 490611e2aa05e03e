"""The native scoring of the withheld-edge eval: one call of ``native_step.cpp`` per eval unit.

PBG's ``eval_fraction`` ranks each bucket's withheld edges before and after training it against
many more negatives per edge than training uses, so on small-dimension graphs the eager scoring
(score blocks, then separate passes for the loss and the rank counts) would cost a large part
of an epoch. The kernel scores one corrupted side of one batch (an eval *unit*, see
:class:`bigembed.ranking.sampled.EvalPlan`) in tiles of rows held in cache: the gathers, the
global embedding, the operator and the ``cos`` normalisation of the training kernel,
register-blocked products against packed negatives, and one pass per score row for the masks,
the rank counts and the loss. No backward, no update.

It returns per positive what :func:`bigembed.ranking.metrics.ranks_and_auc` and the loss count
(unmasked negatives scoring at least as high, below, and in all; the loss before the edge
weight); :func:`bigembed.ranking.sampled.eval_unit`, handed the kernel as its ``scorer`` by the
Hogwild pool, turns them into the same sums as the eager path. It applies to a unit when (else
the eager path, the reference, runs):

* standard relations (not ``dynamic_relations``) whose operator is ``none``, ``translation``
  or ``diagonal`` and without ``all_negs``;
* comparator ``dot`` or ``cos`` without ``bias``; loss ``ranking``, ``softmax`` or
  ``logistic``; ``compute_dtype: float32``; dimension at most
  :data:`bigembed.kernels.native.step.MAX_DIMENSION`;
* the run's kernel choice gave it a library (:mod:`bigembed.kernels.native.choice`).

Regularisation, ``max_norm`` and dropout do not enter the eval's scores, so unlike the training
step they do not keep the eval off the kernel.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import Tensor

from bigembed.kernels.native.abi import LOSS_KINDS, EvalArgs
from bigembed.kernels.native.step import MAX_DIMENSION, relation_plan, scoring_unsupported
from bigembed.model import CosComparator, NegativeSettings, ScoringModel
from bigembed.ranking import SideCounts


class NativeEval:
    """The eval kernel bound to one model and the eval's negative settings: a
    :class:`bigembed.ranking.sampled.SideScorer`."""

    def __init__(self, lib: ctypes.CDLL, model: ScoringModel, negs: NegativeSettings) -> None:
        self.lib = lib
        self.model = model
        self.negs = negs
        self.cos = isinstance(model.comparator, CosComparator)
        self.loss_kind = LOSS_KINDS[model.spec.loss]
        self.margin = float(model.spec.margin)

    @classmethod
    def for_model(
        cls, model: ScoringModel, negs: NegativeSettings, lib: ctypes.CDLL
    ) -> NativeEval | None:
        """The kernel of ``lib`` for this model, or None when none of its units can use it."""
        return None if scoring_unsupported(model) is not None else cls(lib, model, negs)

    def side(
        self,
        relation_idx: int,
        side: int,
        lhs_emb: Tensor,
        rhs_emb: Tensor,
        lhs_idx: np.ndarray,
        rhs_idx: np.ndarray,
        uniform: np.ndarray | None,
    ) -> SideCounts | None:
        """Score corrupted ``side`` (0 lhs, 1 rhs) of a batch (rows ``lhs_idx`` of ``lhs_emb``
        and ``rhs_idx`` of ``rhs_emb``) against its batch negatives and the uniform ones at
        offsets ``uniform`` of the corrupted side's table; None (nothing computed) when the
        unit is outside what the kernel supports."""
        rel = relation_plan(self.model, relation_idx)
        dim = lhs_emb.shape[1]
        negs = self.negs
        size = len(lhs_idx)
        groups = negs.uniform_groups(size)
        if (
            rel is None
            or rhs_emb.shape[1] != dim
            or dim > MAX_DIMENSION
            or size == 0
            or (uniform is None) != (groups == 0)
            or (uniform is not None and len(uniform) != groups * negs.num_uniform_negs)
            or not all(t.dtype == torch.float32 and t.is_contiguous() for t in (lhs_emb, rhs_emb))
        ):
            return None
        idx = [
            np.ascontiguousarray(i, dtype=np.int64)
            for i in (lhs_idx, rhs_idx, np.zeros(0) if uniform is None else uniform)
        ]
        params = [
            None if p is None else p.detach().contiguous()
            for p in (rel.param, rel.lhs_glob, rel.rhs_glob)
        ]
        out = [torch.empty(size, dtype=torch.int64) for _ in range(3)]
        row_loss = torch.empty(size, dtype=torch.float32)

        def ptr(t: Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        args = EvalArgs(
            lhs_emb.data_ptr(),
            rhs_emb.data_ptr(),
            idx[0].ctypes.data,
            idx[1].ctypes.data,
            None if uniform is None else idx[2].ctypes.data,
            *(ptr(p) for p in params),
            dim,
            size,
            negs.num_batch_negs,
            negs.num_uniform_negs if groups > 0 else 0,
            negs.uniform_group,
            int(self.cos),
            self.loss_kind,
            rel.op_kind,
            side,
            self.margin,
            *(t.data_ptr() for t in out),
            row_loss.data_ptr(),
        )
        self.lib.bigembed_native_eval(ctypes.byref(args))
        return SideCounts(out[0], out[1], out[2], row_loss)
