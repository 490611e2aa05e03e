"""What a batch carries through the scoring model: how it is corrupted, the gathered rows of
each side, a corrupted side ready to score, the scores and loss that come out, and KvsAll's
grouped queries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass
class NegativeSettings:
    """How a batch is corrupted (the trainer and the evaluator use different counts)."""

    num_batch_negs: int
    num_uniform_negs: int
    uniform_group: int  # positives sharing one draw of uniform negatives
    disable_lhs: bool = False
    disable_rhs: bool = False
    # The query entity as one more negative (see ScoringModel.self_negative): True, False, or
    # "auto" (on for relations within one entity type). Evaluation leaves it off.
    self_negative: bool | str = False

    def uniform_groups(self, batch: int) -> int:
        return -(-batch // self.uniform_group) if self.num_uniform_negs > 0 else 0


@dataclass
class SideEmbeddings:
    """The gathered rows of one side of a batch."""

    pos: Tensor  # (B, D) embeddings of the batch's entities on this side
    pos_idx: Tensor  # (B,) their offsets in the partition (for all-negatives masking)
    uniform: Tensor | None = None  # (groups, U, D) uniformly drawn negatives
    all: Tensor | None = None  # (N, D) the whole partition, when all_negs


class Corruption(NamedTuple):
    """One corrupted side of a batch, ready to score: the positives' scores, the corrupted
    side's rows (the batch negatives), its uniform negatives ``(groups, U, D)`` or whole
    partition, the positives' offsets, the anchors the negatives are compared with, and
    whether the side is corrupted at all."""

    pos: Tensor
    src: Tensor
    uniform: Tensor | None
    whole: Tensor | None
    idx: Tensor
    anchors: Tensor
    enabled: bool
    # The query entity as a candidate of this side (B, D), prepared like ``src``, and where
    # it is the true answer (B,) (h == t: masked); None when the option is off.
    self_rows: Tensor | None = None
    self_mask: Tensor | None = None


@dataclass
class BatchScores:
    """Positive and negative scores of both directions, plus the loss terms."""

    loss: Tensor
    reg: Tensor
    lhs_pos: Tensor
    lhs_neg: list[Tensor]  # blocks of (B, N_k) negative scores
    rhs_pos: Tensor
    rhs_neg: list[Tensor]
    # Set when the fused loss ran (no score blocks then): negatives above their positive.
    fused_violators: tuple[int, int] | None = None

    def violators(self) -> tuple[int, int]:
        """Negatives scoring above their positive, per corrupted side (lhs, rhs)."""
        if self.fused_violators is not None:
            return self.fused_violators

        def count(pos: Tensor, blocks: list[Tensor]) -> int:
            p = pos.detach().unsqueeze(1)
            return sum(int(torch.count_nonzero(b.detach() > p)) for b in blocks)

        return count(self.lhs_pos, self.lhs_neg), count(self.rhs_pos, self.rhs_neg)


@dataclass
class QueryBatch:
    """A batch of grouped queries of one side (``train_type: KvsAll``): the edges of the batch
    and their distinct queries ``(given entity, relation)``."""

    side: str  # the predicted (corrupted) side: "rhs" for tail queries, "lhs" for head queries
    given: Tensor  # (Q, D) rows of the distinct queries' given entities
    query_rel: Tensor  # (Q,) relation of each distinct query
    whole: Tensor  # (N, D) every row of the predicted side's partition: the candidates
    targets: Tensor  # (B, D) rows of each edge's true entity (for the N3 terms)
    target_idx: Tensor  # (B,) offset of each edge's true entity in the partition
    query_of_edge: Tensor  # (B,) the distinct query (row of ``given``) of each edge
    rel: Tensor  # (B,) relation of each edge
    weight: Tensor | None  # (B,) edge weights
