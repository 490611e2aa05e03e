"""Metric values on hand-built rankings (ties count against the positive, as PBG)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bigembed.ranking.filters import KnownEdges
from bigembed.ranking.full import SideRanks
from bigembed.ranking.metrics import RankingSums, ranks_from_scores, summarize, summarize_groups


def test_summary_of_known_ranks() -> None:
    m = summarize(np.array([1, 2, 4, 10, 60]), np.array([1.0, 0.5, 0.5, 0.0, 0.0]))
    assert m["count"] == 5
    assert m["mr"] == pytest.approx((1 + 2 + 4 + 10 + 60) / 5)
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 10 + 1 / 60) / 5)
    assert m["hits@1"] == pytest.approx(1 / 5)
    assert m["hits@3"] == pytest.approx(2 / 5)
    assert m["hits@10"] == pytest.approx(4 / 5)
    assert m["hits@50"] == pytest.approx(4 / 5)
    assert m["auc"] == pytest.approx(0.4)


def test_ranking_sums_of_known_ranks() -> None:
    """The withheld-edge eval's accumulator (both its eager and its native path end here):
    every hits threshold is inclusive (rank <= k)."""
    sums = RankingSums()
    sums.add_ranks(torch.tensor([1, 2, 3, 4, 10, 11, 50, 51]), torch.tensor([1.0, 0.5] * 4))
    assert (sums.count, sums.hits1, sums.hits3, sums.hits10, sums.hits50) == (8, 1, 3, 5, 7)
    assert sums.rank_sum == 132
    assert sums.rr_sum == pytest.approx(sum(1 / r for r in (1, 2, 3, 4, 10, 11, 50, 51)))
    assert sums.auc_sum == 6.0
    other = RankingSums(count=1, rank_sum=5.0, hits10=1, hits50=1, loss_sum=2.5)
    sums.merge(other)
    assert (sums.count, sums.rank_sum, sums.hits10, sums.loss_sum) == (9, 137, 6, 2.5)


def test_grouped_summaries_match_separate_ones() -> None:
    ranks = np.array([1, 3, 7, 2, 2, 50])
    auc = np.linspace(0, 1, 6)
    groups = np.array([0, 1, 0, 1, 1, 2])
    rows = summarize_groups(ranks, auc, groups, 4)
    for g in range(3):
        sel = groups == g
        assert rows[g] == pytest.approx(summarize(ranks[sel], auc[sel]))
    assert rows[3]["count"] == 0


def test_ties_count_against_the_positive() -> None:
    pos = torch.tensor([1.0, 1.0, 1.0])
    neg = torch.tensor([[0.0, 0.5, 0.9], [1.0, 0.0, 0.0], [1.0, 1.0, 2.0]])
    assert ranks_from_scores(pos, neg).tolist() == [1, 2, 4]


def test_auc_is_fraction_of_other_candidates_strictly_below() -> None:
    # 6 candidates (the true one included); rank 3 -> 2 others >= it, 3 strictly below
    side = SideRanks(raw=np.array([3, 1, 6]), candidates=np.array([6, 6, 6]))
    assert side.auc(False).tolist() == pytest.approx([3 / 5, 1.0, 0.0])
    # filtering 2 known others out of the 5: rank 3 -> 1 (both were above it)
    side.filtered, side.removed = np.array([1, 1, 6]), np.array([2, 0, 0])
    assert side.auc(True).tolist() == pytest.approx([1.0, 1.0, 0.0])


def test_known_edges_are_deduplicated_and_indexed_both_ways() -> None:
    known = KnownEdges(
        np.array([0, 0, 0, 1, 0]),
        np.array([0, 0, 1, 0, 0]),
        np.array([5, 6, 5, 5, 5]),
        num_relations=2,
    )
    assert known.num_edges == 4  # (0, 0, 5) appears twice
    rows, tails = known.true_tails(np.array([0, 1, 2]), np.array([0, 0, 0]))
    assert rows.tolist() == [0, 0, 1] and tails.tolist() == [5, 6, 5]
    rows, heads = known.true_heads(np.array([5]), np.array([0]))
    assert rows.tolist() == [0, 0] and heads.tolist() == [0, 1]


def _reference_ranks_auc(pos: torch.Tensor, blocks: list[torch.Tensor]):
    """The definitions, the slow way: bool masks summed per row."""
    from bigembed.model.negatives import MASKED

    ranks = torch.ones(pos.shape[0], dtype=torch.long)
    below, valid = torch.zeros(pos.shape[0]), torch.zeros(pos.shape[0])
    p = pos.unsqueeze(1)
    for b in blocks:
        ok = b > MASKED / 2
        ranks += torch.count_nonzero((b >= p) & ok, dim=1)
        below += ((b < p) & ok).sum(dim=1)
        valid += ok.sum(dim=1)
    return ranks, below / valid.clamp_min(1)


def test_fast_ranks_and_auc_equal_the_definitions_bit_for_bit() -> None:
    """Ties (scores drawn from a few values), masked negatives, a masked positive, a NaN
    positive and positives below the mask value, negatives in two blocks: the two-pass
    counting gives the same ranks and the same AUC bits as the bool-mask definitions."""
    from bigembed.model.negatives import MASKED
    from bigembed.ranking.metrics import auc_from_scores, ranks_and_auc

    gen = torch.Generator().manual_seed(3)
    b, n1, n2 = 64, 37, 50
    values = torch.tensor([-1.0, 0.0, 0.25, 0.5, 1.0])
    pos = values[torch.randint(5, (b,), generator=gen)]
    blocks = [values[torch.randint(5, (b, n), generator=gen)] for n in (n1, n2)]
    for blk in blocks:
        blk[torch.rand(blk.shape, generator=gen) < 0.1] = MASKED
    pos[3] = MASKED
    pos[5] = float("nan")
    pos[9] = -float("inf")  # a diverged model: masked negatives still never count
    pos[11] = MASKED * 4
    blocks[0][7, :] = MASKED  # a row with nothing to rank against
    ranks, auc = ranks_and_auc(pos, blocks)
    want_ranks, want_auc = _reference_ranks_auc(pos, blocks)
    assert torch.equal(ranks, want_ranks)
    assert torch.equal(auc, want_auc)
    assert torch.equal(ranks_from_scores(pos, blocks), want_ranks)
    assert torch.equal(auc_from_scores(pos, torch.cat(blocks, 1)), want_auc)


@pytest.mark.parametrize("num", [12, 10])  # whole chunks (in-place diagonal), a padded chunk
def test_scoring_only_batch_negatives_and_hinge_equal_the_differentiable_path(num: int) -> None:
    """Evaluation (no gradient) masks each row's own batch negative and sums the ranking hinge
    in place: the same values, bit for bit, as the differentiable path training takes."""
    from bigembed.model.comparators import DotComparator
    from bigembed.model.losses import ranking_loss
    from bigembed.model.negatives import batch_negative_scores

    gen = torch.Generator().manual_seed(5)
    anchors, src = torch.randn(num, 6, generator=gen), torch.randn(num, 6, generator=gen)
    pos = torch.randn(num, generator=gen)
    cmp = DotComparator()
    with torch.no_grad():
        fast = batch_negative_scores(cmp, anchors, src, 4, torch.float32)
        fast_loss = ranking_loss(pos, [fast, fast * 0.5], None, 0.1)
    leaf = anchors.clone().requires_grad_(True)
    slow = batch_negative_scores(cmp, leaf, src, 4, torch.float32)
    slow_loss = ranking_loss(pos, [slow, slow * 0.5], None, 0.1)
    assert torch.equal(fast, slow.detach())
    assert torch.equal(fast_loss, slow_loss.detach())
