"""Distributed evaluation's split of the edges over ranks, and the merge of their ranks.

Every rank of ``bigembed eval --rank R`` loads the same edges; :func:`eval_shares` gives each
its share with Bagua's load-balancing sampler (:func:`bigembed.sampling.balanced_split`, no
shuffle: evaluation needs no randomness) over :func:`edge_costs`, so that the ranks finish at
about the same time even when relations rank against entity types of very different sizes.
Each rank ranks its share; rank 0 puts the per-edge ranks back in input order
(:func:`merge_rankings`) and builds the report from them with the code a single machine uses,
so the report is the one-machine report.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bigembed.eval.evaluation import Evaluation
from bigembed.model import OPERATOR_MADDS
from bigembed.ranking import SIDES, RankingResult, SideRanks
from bigembed.sampling import balanced_split


def edge_costs(evaluation: Evaluation) -> torch.Tensor:
    """Per evaluated edge (int64): the multiply-adds of ranking it on both sides under full
    ranking, i.e. for each side the candidates (every entity of that side's type) times the
    dimension of a score, plus the operator on the anchor. Edges of one relation cost the same;
    what differs between relations is the size of the candidate types and the operator."""
    trained, tables = evaluation.trained, evaluation.tables
    cfg = trained.config
    loader = evaluation.loader
    per_relation = []
    for rid, (lhs, rhs) in enumerate(zip(loader.lhs_types, loader.rhs_types, strict=True)):
        operator = str((cfg.relations[0] if cfg.dynamic_relations else cfg.relations[rid]).operator)
        cost = 0
        for etype in (lhs, rhs):
            d = tables.dimension(etype)
            cost += tables.total(etype) * d + OPERATOR_MADDS[operator](d)
        per_relation.append(cost)
    costs = np.asarray(per_relation, dtype=np.int64)[evaluation.edges.rel]
    return torch.from_numpy(costs)


def eval_shares(costs: torch.Tensor, num_ranks: int) -> list[np.ndarray]:
    """Each rank's edges (ascending indices): Bagua's split of ``costs`` without shuffling,
    less the repeats its padding adds (a repeated edge is ranked once, by the first rank that
    has it), so the shares are disjoint and cover every edge."""
    split = balanced_split(costs, num_ranks, shuffle=False)
    seen = torch.zeros(len(costs), dtype=torch.bool)
    shares = []
    for share in split:
        fresh = share[~seen[share]]
        seen[fresh] = True
        shares.append(np.sort(fresh.numpy()))
    return shares


def merge_rankings(
    num_edges: int, parts: Sequence[tuple[np.ndarray, RankingResult]]
) -> RankingResult:
    """The ranking of all ``num_edges`` edges from the rankings of the ranks' shares (``rows``:
    which edges a part ranked, in its order). Refuses shares that overlap or leave edges out."""
    counts = np.bincount(
        np.concatenate([rows for rows, _ in parts]).astype(np.int64), minlength=num_edges
    )
    if len(counts) != num_edges or not bool((counts == 1).all()):
        raise ValueError(
            f"the ranks' shares do not cover the {num_edges} edges exactly once "
            f"({int((counts == 0).sum())} missing, {int((counts > 1).sum())} ranked twice)"
        )
    rel = np.zeros(num_edges, np.int64)
    for rows, part in parts:
        rel[rows] = part.rel
    sides: dict[str, SideRanks | None] = {}
    for name in SIDES:
        pieces = [(rows, part.side(name)) for rows, part in parts]
        present = [(rows, side) for rows, side in pieces if side is not None]
        if not present:
            sides[name] = None
            continue
        filtered = all(side.filtered is not None for _, side in present)
        merged = SideRanks(
            raw=np.zeros(num_edges, np.int64),
            candidates=np.zeros(num_edges, np.int64),
            filtered=np.zeros(num_edges, np.int64) if filtered else None,
            removed=np.zeros(num_edges, np.int64) if filtered else None,
        )
        for rows, side in present:
            merged.raw[rows] = side.raw
            merged.candidates[rows] = side.candidates
            if merged.filtered is not None and side.filtered is not None:
                merged.filtered[rows] = side.filtered
            if merged.removed is not None and side.removed is not None:
                merged.removed[rows] = side.removed
        sides[name] = merged
    return RankingResult(rel=rel, lhs=sides["lhs"], rhs=sides["rhs"])
