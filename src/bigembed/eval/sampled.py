"""PBG-style sampled-negative evaluation (what ``torchbiggraph_eval`` reports).

Edges are grouped by bucket (the partitions of their two entities), cut into batches as in
training, and each positive is ranked against the *sampled* negatives training would use: the
config's ``num_batch_negs`` other positives of its chunk and ``num_uniform_negs`` entities drawn
from the same partition (or the whole partition with ``all_negs``). Ranks are raw only; the
numbers depend on the negative counts and on the partitioning, which is why full ranking is
bigembed's default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bigembed.buckets import bucket_sides
from bigembed.checkpoints import EntityTables
from bigembed.model import MASKED, NegativeSettings, ScoringModel
from bigembed.partition_keys import PartitionKey
from bigembed.ranking import EvalEdges, RankingResult, SideRanks, score_batches


@dataclass
class SampledResult:
    ranking: RankingResult  # rows in evaluation order (not input order)
    loss_sum: float
    num_negatives: float  # mean number of negatives per ranked positive


def _partition_of(bases: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(bases, ids, side="right") - 1


@torch.no_grad()
def sampled_ranks(
    model: ScoringModel,
    tables: EntityTables,
    edges: EvalEdges,
    negs: NegativeSettings,
    batch_size: int,
    seed: int,
    progress: Callable[[float], None] | None = None,
) -> SampledResult:
    """Rank every edge against sampled negatives; returns per-positive ranks of both sides."""
    model.eval()
    cfg = tables.trained.config
    relations = cfg.relations
    rel_cfg = [relations[0]] * max(1, model.num_relations) if model.dynamic else list(relations)
    lhs_types = np.array([r.lhs for r in rel_cfg])
    rhs_types = np.array([r.rhs for r in rel_cfg])
    n = len(edges)
    lhs_part = np.zeros(n, np.int64)
    rhs_part = np.zeros(n, np.int64)
    for types, ids, dest in ((lhs_types, edges.lhs, lhs_part), (rhs_types, edges.rhs, rhs_part)):
        for etype in np.unique(types[edges.rel]).tolist():
            sel = np.flatnonzero(types[edges.rel] == etype)
            dest[sel] = _partition_of(tables.bases(etype), ids[sel])
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("rel", "lr", "lc", "rr", "rc")}
    loss_sum = 0.0
    buckets = (
        np.unique(np.stack([lhs_part, rhs_part], axis=1), axis=0)
        if n
        else np.empty((0, 2), np.int64)
    )
    for i, j in buckets:
        sel = np.flatnonzero((lhs_part == i) & (rhs_part == j))
        rel = edges.rel[sel]
        lhs_off = np.empty(len(sel), np.int64)
        rhs_off = np.empty(len(sel), np.int64)
        for types, ids, part, dest in (
            (lhs_types, edges.lhs, int(i), lhs_off),
            (rhs_types, edges.rhs, int(j), rhs_off),
        ):
            for etype in np.unique(types[rel]).tolist():
                m = np.flatnonzero(types[rel] == etype)
                dest[m] = ids[sel[m]] - tables.bases(etype)[part]
        cache: dict[PartitionKey, torch.Tensor] = {}

        def embeddings(
            key: PartitionKey, cache: dict[PartitionKey, torch.Tensor] = cache
        ) -> torch.Tensor:
            if key not in cache:
                cache[key] = tables.table(*key)
            return cache[key]

        for scored in score_batches(
            model,
            embeddings,
            bucket_sides(cfg, (int(i), int(j))),
            torch.from_numpy(lhs_off),
            torch.from_numpy(rhs_off),
            torch.from_numpy(rel),
            None,
            negs,
            batch_size,
            gen,
            rng,
        ):
            batch, scores, all_negs = scored.batch, scored.scores, scored.all_negs
            luni, runi = scored.lhs_uniform, scored.rhs_uniform
            loss_sum += float(scores.loss)
            out["rel"].append(batch.rel.numpy())
            for key, pos, neg, idx, uni, enabled in (
                ("l", scores.lhs_pos, scores.lhs_neg, batch.lhs, luni, not negs.disable_lhs),
                ("r", scores.rhs_pos, scores.rhs_neg, batch.rhs, runi, not negs.disable_rhs),
            ):
                same = _same_entity(idx, uni, negs, all_negs)
                ranks, cands = _ranks(pos, neg, same) if enabled else (None, None)
                out[f"{key}r"].append(ranks if ranks is not None else np.empty(0, np.int64))
                out[f"{key}c"].append(cands if cands is not None else np.empty(0, np.int64))
            if progress:
                progress(len(batch))
    cat = {k: np.concatenate(v) if v else np.empty(0, np.int64) for k, v in out.items()}
    lhs = SideRanks(raw=cat["lr"], candidates=cat["lc"]) if not negs.disable_lhs else None
    rhs = SideRanks(raw=cat["rr"], candidates=cat["rc"]) if not negs.disable_rhs else None
    counts = [s.candidates - 1 for s in (lhs, rhs) if s is not None and len(s.candidates)]
    mean_negs = float(np.concatenate(counts).mean()) if counts else 0.0
    return SampledResult(RankingResult(rel=cat["rel"], lhs=lhs, rhs=rhs), loss_sum, mean_negs)


def _same_entity(
    idx: torch.Tensor, uniform: torch.Tensor | None, negs: NegativeSettings, all_negs: bool
) -> list[torch.Tensor | None]:
    """Per negative block: where the negative is the positive's own entity (a batch negative
    from another edge with the same entity, or a uniform draw of it). Such a negative ties
    with the positive exactly, but the two scores come from different kernels (elementwise
    product vs. matmul) and may differ in the last bit; the tie must not depend on that."""
    if all_negs:
        return [None]  # the positive itself is masked; every other entity is a distinct one
    out: list[torch.Tensor | None] = []
    n = idx.shape[0]
    if negs.num_batch_negs > 0:
        chunk = min(negs.num_batch_negs, n)
        rows = torch.arange(n).unsqueeze(1)
        cols = rows - rows % chunk + torch.arange(chunk).unsqueeze(0)
        out.append(idx[cols.clamp(max=n - 1)] == idx.unsqueeze(1))  # padding is masked anyway
    if uniform is not None and negs.num_uniform_negs > 0:
        drawn = uniform.view(-1, negs.num_uniform_negs)
        group = torch.arange(n) // negs.uniform_group
        out.append(drawn[group] == idx.unsqueeze(1))
    return out


def _ranks(
    pos: torch.Tensor, neg: list[torch.Tensor], same: list[torch.Tensor | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Ranks (ties count against the positive) and candidates (unmasked negatives + 1)."""
    ranks = torch.ones(pos.shape[0], dtype=torch.long)
    cands = torch.ones(pos.shape[0], dtype=torch.long)
    p = pos.unsqueeze(1)
    for block, tie in zip(neg, same, strict=True):
        valid = block > MASKED / 2
        above = block >= p if tie is None else (block >= p) | tie
        ranks += (above & valid).sum(dim=1)
        cands += valid.sum(dim=1)
    return ranks.numpy(), cands.numpy()
