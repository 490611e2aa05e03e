"""The withheld-edge eval's units (one corrupted side of one batch each, in this process or in
the Hogwild workers) against the general computation (both sides' score blocks through
``ScoringModel.forward``, then ``ranks_and_auc``), which is what the eval computed before and
what ``bigembed eval --protocol sampled`` still uses: every reported sum must be the same,
bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bigembed.config import model_spec, parse_config_dict
from bigembed.kernels.step import Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.model.negatives import MASKED
from bigembed.ranking.metrics import RankingSums
from bigembed.ranking.sampled import (
    evaluate_edges,
    merge_units,
    plan_eval,
    score_batches,
)

SIDES = [(("n", 0), ("n", 1)), (("n", 1), ("n", 0))]


def _model(comparator: str, loss: str, dynamic: bool, seed: int = 0) -> ScoringModel:
    relations = [
        {"name": "a", "lhs": "n", "rhs": "n", "operator": "diagonal", "weight": 0.5},
        {"name": "b", "lhs": "n", "rhs": "n", "operator": "translation"},
    ]
    cfg = parse_config_dict(
        {
            "entities": {"n": {"num_partitions": 2}},
            "relations": relations[:1] if dynamic else relations,
            "dynamic_relations": dynamic,
            "dimension": 8,
            "comparator": comparator,
            "loss_fn": loss,
            "global_emb": not dynamic,
            "entity_path": "/nonexistent/e",
            "edge_paths": ["/nonexistent/p"],
            "checkpoint_path": "/nonexistent/c",
        }
    )
    model = ScoringModel(model_spec(cfg, 2 if dynamic else 0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1 if p.dim() == 1 else 0))
    return model


def _tables(seed: int = 1) -> dict:
    # Small partitions: uniform draws and batch negatives often hit the positive's own entity,
    # so ties with the positive (counted against it) occur.
    gen = torch.Generator().manual_seed(seed)
    return {
        ("n", 0): Table(torch.randn(23, 8, generator=gen), torch.zeros(23)),
        ("n", 1): Table(torch.randn(17, 8, generator=gen), torch.zeros(17)),
    }


def _edges(n: int, seed: int = 2, weighted: bool = True):
    gen = torch.Generator().manual_seed(seed)
    lhs = torch.randint(17, (n,), generator=gen)  # valid in both partitions
    rhs = torch.randint(17, (n,), generator=gen)
    rel = torch.randint(2, (n,), generator=gen)
    weight = torch.rand(n, generator=gen) + 0.5 if weighted else None
    return lhs, rhs, rel, weight


def _general(model, tables, lhs, rhs, rel, weight, negs, batch_size, seed) -> RankingSums:
    """The general computation, as the eval did it before the tiles."""
    sums = RankingSums()
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for scored in score_batches(
        model,
        lambda key: tables[key].emb,
        SIDES,
        lhs,
        rhs,
        rel,
        weight,
        negs,
        batch_size,
        gen,
        rng,
    ):
        s = scored.scores
        sums.loss_sum += float(s.loss)
        for pos, neg, on in (
            (s.lhs_pos, s.lhs_neg, not negs.disable_lhs),
            (s.rhs_pos, s.rhs_neg, not negs.disable_rhs),
        ):
            if on:
                sums.add_ranks(*_ranks_and_auc(pos, neg))
    return sums


def _ranks_and_auc(pos, blocks):
    """The definitions: rank = 1 + unmasked negatives scoring >= the positive; AUC = the
    fraction of unmasked negatives scoring below it."""
    p = pos.unsqueeze(1)
    at_least = below = valid = torch.zeros(pos.shape[0], dtype=torch.long)
    for b in blocks:
        ok = b > MASKED / 2
        at_least = at_least + ((b >= p) & ok).sum(1)
        below = below + ((b < p) & ok).sum(1)
        valid = valid + ok.sum(1)
    return at_least + 1, below.float() / valid.float().clamp_min(1)


def _assert_same(got: RankingSums, want: RankingSums) -> None:
    assert dataclasses.asdict(got) == dataclasses.asdict(want)  # bit for bit


CASES = [
    # comparator, loss, dynamic, NegativeSettings, batch size, edges
    ("cos", "ranking", False, NegativeSettings(20, 15, 60), 60, 130),
    ("dot", "ranking", True, NegativeSettings(20, 15, 25), 60, 130),  # groups across chunks
    ("cos", "softmax", True, NegativeSettings(60, 30, 60), 60, 100),  # one chunk per batch
    ("dot", "softmax", False, NegativeSettings(7, 11, 13), 21, 50),
    ("cos", "ranking", False, NegativeSettings(0, 15, 60), 60, 90),  # uniform only
    ("cos", "ranking", True, NegativeSettings(20, 0, 60), 60, 90),  # batch negatives only
    ("cos", "softmax", False, NegativeSettings(20, 15, 60, disable_lhs=True), 60, 90),
]


@pytest.mark.parametrize(("comparator", "loss", "dynamic", "negs", "batch_size", "n"), CASES)
def test_eval_units_report_what_the_general_computation_reports(
    comparator, loss, dynamic, negs, batch_size, n
) -> None:
    model = _model(comparator, loss, dynamic)
    tables = _tables()
    lhs, rhs, rel, weight = _edges(n)
    if dynamic:
        rel = rel % 2
    want = _general(model, tables, lhs, rhs, rel, weight, negs, batch_size, 5)
    got = evaluate_edges(model, tables, SIDES, lhs, rhs, rel, weight, negs, batch_size, 5)
    assert want.count == n * (1 if negs.disable_lhs else 2)
    assert want.hits1 < want.count  # the ranks are not trivial
    _assert_same(got, want)


def test_scores_as_low_as_a_mask_are_counted_one_by_one() -> None:
    """A negative scaled by -1e10 scores below the mask threshold against some anchors: the
    unmasked count known from the masks alone must not be used (those are not valid ones)."""
    model = _model("dot", "ranking", False)
    tables = _tables()
    # Row 20 is never a positive (edges use rows 0-16), only a uniform draw: its scores are
    # about +-1e10, some of them below the mask threshold.
    tables[("n", 0)].emb[20] *= -1e10
    lhs, rhs, rel, weight = _edges(80)
    negs = NegativeSettings(20, 15, 40)
    want = _general(model, tables, lhs, rhs, rel, weight, negs, 40, 3)
    got = evaluate_edges(model, tables, SIDES, lhs, rhs, rel, weight, negs, 40, 3)
    _assert_same(got, want)
    assert want.auc_sum < want.count  # some negatives rank below some positives


@pytest.mark.integration
@pytest.mark.parametrize("steal", [True, False])
def test_the_workers_rank_an_eval_as_the_main_process_does(steal: bool) -> None:
    """The workers score with the native kernel where it applies (as the main process does
    when handed it), else eagerly."""
    from bigembed.kernels import choose_kernel
    from bigembed.train.hogwild.pool import HogwildPool, WorkerSetup

    model = _model("cos", "ranking", False)
    model.share_memory()
    states = [torch.zeros_like(p).share_memory_() for p in model.parameters()]
    negs = NegativeSettings(20, 15, 60)
    kernel = choose_kernel("auto", model, negs)
    setup = WorkerSetup(model, states, negs, 0.1, 0.1, 60, False, kernel=kernel)
    tables = _tables()
    for t in tables.values():
        t.emb.share_memory_()
        t.state.share_memory_()
    lhs, rhs, rel, weight = _edges(250)
    scorer = kernel.eval_kernel(model, negs)
    here = evaluate_edges(model, tables, SIDES, lhs, rhs, rel, weight, negs, 60, 9, scorer=scorer)
    plan = plan_eval(
        model, lambda k: tables[k].emb.shape[0], SIDES, lhs, rhs, rel, weight, negs, 60, 9
    )
    assert plan.num_units == 10
    pool = HogwildPool(setup, 2, steal=steal)
    try:
        results = pool.run_eval(tables, SIDES, plan)
        again = evaluate_edges(
            model,
            tables,
            SIDES,
            lhs,
            rhs,
            rel,
            weight,
            negs,
            60,
            9,
            lambda p: pool.run_eval(tables, SIDES, p),
        )
    finally:
        pool.close()
    _assert_same(merge_units(model, plan, results), here)
    _assert_same(again, here)
