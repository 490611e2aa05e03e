"""Scoring a bucket's edges against sampled negatives, for ranking (not for training).

Both the withheld-edge eval of training (PBG's ``eval_fraction``) and the ``sampled`` protocol
of ``bigembed eval`` (what ``torchbiggraph_eval`` reports) cut a bucket's edges into batches as
training does and score each positive against the negatives training would use. The batch size
is rounded up to a multiple of ``num_batch_negs`` so every batch-negative chunk is full.

The withheld-edge eval is planned first (:func:`plan_eval`: batches and uniform draws) and cut
into independent *units*, one corrupted side of one batch each (:func:`eval_unit`), so that
training's Hogwild workers can rank them; :func:`merge_units` adds their results in the order
ranking the batches one by one would, so the sums do not depend on where the units ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from bigembed.buckets import Batch, draw_uniform, gather_drawn, gather_side, make_batches
from bigembed.model import (
    BatchScores,
    Corruption,
    CosComparator,
    DotComparator,
    NegativeSettings,
    ScoringModel,
    batch_negative_unmasked,
)
from bigembed.partition_keys import BucketSides, PartitionKey
from bigembed.ranking.metrics import RankingSums, ranks_and_auc


class EmbeddingTable(Protocol):
    """A loaded partition: anything with its embeddings as ``emb`` (N, D)."""

    emb: Tensor


def eval_batch_size(batch_size: int, negs: NegativeSettings) -> int:
    """``batch_size`` rounded up to a multiple of ``num_batch_negs`` (unchanged without them)."""
    if negs.num_batch_negs > 0:
        return -(-batch_size // negs.num_batch_negs) * negs.num_batch_negs
    return batch_size


@dataclass
class ScoredBatch:
    batch: Batch
    scores: BatchScores
    all_negs: bool  # the batch's relation ranks against all entities of the partition
    lhs_uniform: Tensor | None  # indices of the uniform negatives drawn for the lhs side
    rhs_uniform: Tensor | None


@torch.no_grad()
def score_batches(
    model: ScoringModel,
    embeddings: Callable[[PartitionKey], Tensor],
    sides: BucketSides,
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    negs: NegativeSettings,
    batch_size: int,
    gen: torch.Generator,
    rng: np.random.Generator,
) -> Iterator[ScoredBatch]:
    """Batches of one bucket's edges (offsets in its partitions) with their scores.

    ``embeddings`` gives a partition's embedding table; ``gen`` draws the uniform negatives and
    ``rng`` the relation order of the batches.
    """
    batches = make_batches(
        lhs, rhs, rel, weight, eval_batch_size(batch_size, negs), model.dynamic, rng
    )
    for batch in batches:
        lhs_key, rhs_key = sides[batch.relation_idx]
        all_negs = bool(model.relation_spec(batch.relation_idx).all_negs)
        ls, luni = gather_side(embeddings(lhs_key), batch.lhs, negs, all_negs, gen, None, False)
        rs, runi = gather_side(embeddings(rhs_key), batch.rhs, negs, all_negs, gen, None, False)
        scores = model(ls, rs, batch.rel, batch.relation_idx, batch.weight, negs)
        yield ScoredBatch(batch, scores, all_negs, luni, runi)


@dataclass
class EvalBatch:
    """One batch of a withheld-edge eval with its uniform negatives already drawn, so that any
    process can rank it (numpy arrays: pickled by value, no shared-memory handles)."""

    lhs: np.ndarray  # (B,) offsets in the lhs partition
    rhs: np.ndarray
    rel: np.ndarray
    weight: np.ndarray | None
    relation_idx: int
    all_negs: bool
    uniform: tuple[np.ndarray | None, np.ndarray | None]  # per side (lhs, rhs)


@dataclass
class EvalPlan:
    """The batches of one eval and the negatives they are ranked against. Its work is cut
    into *units*, one per (batch, corrupted side): unit ``2 * b + s`` corrupts side ``s``
    (0 = lhs, 1 = rhs) of batch ``b``; units are independent of each other."""

    batches: list[EvalBatch]
    negs: NegativeSettings

    @property
    def num_units(self) -> int:
        return 2 * len(self.batches)


@dataclass
class UnitResult:
    """One unit's loss term (fp32, as the side's ``loss_fn`` gives it) and its ranking sums
    (without the loss)."""

    loss: float
    sums: RankingSums


def plan_eval(
    model: ScoringModel,
    num_rows: Callable[[PartitionKey], int],
    sides: BucketSides,
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    negs: NegativeSettings,
    batch_size: int,
    seed: int,
) -> EvalPlan:
    """Cut the edges into batches and draw their uniform negatives (``num_rows``: a
    partition's row count), as :func:`score_batches` does with generators seeded by
    ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    out = []
    bs = eval_batch_size(batch_size, negs)
    for batch in make_batches(lhs, rhs, rel, weight, bs, model.dynamic, rng):
        lhs_key, rhs_key = sides[batch.relation_idx]
        all_negs = bool(model.relation_spec(batch.relation_idx).all_negs)
        drawn = tuple(
            None if u is None else u.numpy()
            for u in (
                draw_uniform(num_rows(lhs_key), len(batch), negs, all_negs, gen),
                draw_uniform(num_rows(rhs_key), len(batch), negs, all_negs, gen),
            )
        )
        out.append(
            EvalBatch(
                batch.lhs.numpy(),
                batch.rhs.numpy(),
                batch.rel.numpy(),
                None if batch.weight is None else batch.weight.numpy(),
                batch.relation_idx,
                all_negs,
                (drawn[0], drawn[1]),
            )
        )
    return EvalPlan(out, negs)


@dataclass(frozen=True)
class SideCounts:
    """What a :class:`SideScorer` returns, per positive of one corrupted side: its unmasked
    negatives scoring at least as high (``at_least``), below it (``below``) and in all
    (``valid``), as int64, and its loss before the edge weight (``row_loss``, float32)."""

    at_least: Tensor
    below: Tensor
    valid: Tensor
    row_loss: Tensor


class SideScorer(Protocol):
    """Another implementation of a unit's scoring (training's native kernel,
    :class:`bigembed.kernels.native.eval.NativeEval`)."""

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
        offsets ``uniform`` of the corrupted side's table, as :func:`eval_unit` does; None
        when it cannot (the eager path runs)."""
        ...


@torch.no_grad()
def eval_unit(
    model: ScoringModel,
    embeddings: Callable[[PartitionKey], Tensor],
    sides: BucketSides,
    plan: EvalPlan,
    unit: int,
    scorer: SideScorer | None = None,
) -> UnitResult:
    """Rank one corrupted side of one batch of ``plan`` (see :class:`EvalPlan`): by
    ``scorer`` when given and it can, else eagerly (the reference)."""
    b, k = plan.batches[unit // 2], unit % 2
    negs = plan.negs
    keys = sides[b.relation_idx]
    weight = None if b.weight is None else torch.from_numpy(b.weight)
    enabled = not (negs.disable_rhs if k else negs.disable_lhs)
    if scorer is not None and enabled and not b.all_negs:
        counts = scorer.side(
            b.relation_idx, k, embeddings(keys[0]), embeddings(keys[1]), b.lhs, b.rhs, b.uniform[k]
        )
        if counts is not None:
            return _unit_from_counts(counts, weight)
    gathered = [
        gather_drawn(
            embeddings(key),
            torch.from_numpy(idx),
            negs,
            b.all_negs and s == k,
            None if uidx is None or s != k else torch.from_numpy(uidx),
            None,
            False,
        )
        for s, (key, idx, uidx) in enumerate(zip(keys, (b.lhs, b.rhs), b.uniform, strict=True))
    ]
    rel = torch.from_numpy(b.rel)
    side = model.corrupted_sides(gathered[0], gathered[1], rel, b.relation_idx, negs)[k]
    sums = RankingSums()
    if not side.enabled:
        return UnitResult(float(side.pos.sum() * 0.0), sums)
    blocks = model.negative_blocks(side, negs, b.all_negs)
    unmasked = _unmasked_counts(model, side, negs, b.all_negs)
    sums.add_ranks(*ranks_and_auc(side.pos, blocks, unmasked))
    return UnitResult(float(model.loss_fn(side.pos, blocks, weight)), sums)


def _unit_from_counts(counts: SideCounts, weight: Tensor | None) -> UnitResult:
    """A unit's result from a scorer's per-positive counts and losses, computed as the
    eager path computes it from the score blocks (:func:`ranks_and_auc`, the loss's weighted
    fp32 sum)."""
    sums = RankingSums()
    auc = counts.below.float() / counts.valid.float().clamp_min(1)
    sums.add_ranks(counts.at_least + 1, auc)
    per_positive = counts.row_loss if weight is None else counts.row_loss * weight
    return UnitResult(float(per_positive.sum()), sums)


#: Scores are bounded by the product of the norms (dot, cos); below this bound none can be NaN
#: or as low as a mask (-1e9 / 2), so every negative but the masked ones is valid.
_SAFE_BOUND = 1e8


def _unmasked_counts(
    model: ScoringModel, side: Corruption, negs: NegativeSettings, all_negs: bool
) -> Tensor | None:
    """Per positive: its negatives that are not masked (its own entity and a padded chunk's
    missing rows among the batch negatives), when no score can be NaN or as low as a mask;
    else None (they are counted from the scores)."""
    if all_negs or type(model.comparator) not in (DotComparator, CosComparator):
        return None
    num = side.anchors.shape[0]
    others = [
        t for t in (side.src if negs.num_batch_negs > 0 else None, side.uniform) if t is not None
    ]
    if not others:
        return None
    bound = side.anchors.norm(dim=-1).max()
    bound = bound * max(t.norm(dim=-1).max() for t in others)
    if not bool(bound < _SAFE_BOUND):  # also False when NaN
        return None
    counts = torch.zeros(num, dtype=torch.float64)
    if negs.num_batch_negs > 0:
        counts += batch_negative_unmasked(num, negs.num_batch_negs)
    if side.uniform is not None:
        counts += side.uniform.shape[1]
    return counts


def merge_units(model: ScoringModel, plan: EvalPlan, results: Sequence[UnitResult]) -> RankingSums:
    """The summed metrics of an eval from its units' results (in unit order): the same sums,
    added in the same order, as ranking the batches one after the other."""
    sums = RankingSums()
    for b, batch in enumerate(plan.batches):
        lhs, rhs = results[2 * b], results[2 * b + 1]
        # A batch's loss is the fp32 sum of its two sides, times the relation's weight.
        loss = torch.tensor(lhs.loss) + torch.tensor(rhs.loss)
        sums.loss_sum += float(loss * float(model.relation_spec(batch.relation_idx).weight))
        sums.merge(lhs.sums)
        sums.merge(rhs.sums)
    return sums


def evaluate_edges(
    model: ScoringModel,
    tables: Mapping[PartitionKey, EmbeddingTable],
    sides: BucketSides,
    lhs: Tensor,
    rhs: Tensor,
    rel: Tensor,
    weight: Tensor | None,
    negs: NegativeSettings,
    batch_size: int,
    seed: int,
    run_units: Callable[[EvalPlan], list[UnitResult]] | None = None,
    scorer: SideScorer | None = None,
) -> RankingSums:
    """Rank each edge against its negatives on both sides; returns the summed metrics.

    The units of the eval (:class:`EvalPlan`) run here, or in ``run_units`` if given (training
    hands its Hogwild pool: :meth:`bigembed.train.hogwild.pool.HogwildPool.run_eval`), with the
    same results: each unit scores one side of one batch as :meth:`ScoringModel.forward` does
    and counts its ranks with one comparison pass when its unmasked negatives are known, or
    has ``scorer`` (training's native kernel) score it.
    """
    plan = plan_eval(
        model,
        lambda key: tables[key].emb.shape[0],
        sides,
        lhs,
        rhs,
        rel,
        weight,
        negs,
        batch_size,
        seed,
    )
    if run_units is not None:
        return merge_units(model, plan, run_units(plan))
    results = [
        eval_unit(model, lambda key: tables[key].emb, sides, plan, u, scorer)
        for u in range(plan.num_units)
    ]
    return merge_units(model, plan, results)
