"""The native scoring of the withheld-edge eval (bigembed.kernels.native.eval) against the eager
units (bigembed.ranking.sampled.eval_unit without a scorer), its reference.

On tables whose every score is exact in fp32 (small integers with ``dot``; rows of four +-1
with ``cos``, normalised to +-0.5) both paths compute the same scores whatever the order of
their sums, so every count is equal: ranks (ties with the positive count against it), hits,
AUC, the masks (a row's own positive, a short chunk's padding). The losses agree to float
rounding. On Gaussian tables (no exact ties) the same holds for the operators and global
embeddings that the exact tables cannot exercise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bigembed.kernels.native import build as native_build
from bigembed.kernels.native import eval as native_eval
from bigembed.kernels.native.eval import NativeEval
from bigembed.kernels.step import Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.model.spec import ModelSpec, RelationSpec
from bigembed.ranking.metrics import RankingSums
from bigembed.ranking.sampled import (
    evaluate_edges,
    merge_units,
    plan_eval,
    score_batches,
)

DIM = 16
SIDES = [(("e", 0), ("e", 1))]

needs_kernel = pytest.mark.skipif(
    native_build.native_library() is None, reason="no C++ compiler: the kernel cannot be built"
)


def _model(comparator: str, loss: str, operator: str, glob: bool, exact: bool) -> ScoringModel:
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", operator, weight=1.5),),
        entity_dims={"e": DIM},
        comparator=comparator,
        loss=loss,
        global_emb=glob,
    )
    model = ScoringModel(spec)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not exact:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
            elif comparator == "dot":  # small integers: every product and sum exact
                p.copy_(torch.randint(-1, 2, p.shape, generator=gen).float())
                if "diagonal" in name:
                    p.copy_(torch.randint(1, 3, p.shape, generator=gen).float())
            elif "diagonal" in name:  # +-1 keeps four +-1 per row (norm 2)
                p.copy_(torch.randint(0, 2, p.shape, generator=gen).float() * 2 - 1)
            else:  # cos: a translation or global embedding would change the norms
                p.zero_()
    return model


def _table(rows: int, comparator: str, exact: bool, gen: torch.Generator) -> Table:
    if not exact:
        emb = torch.randn(rows, DIM, generator=gen)
    elif comparator == "dot":
        emb = torch.randint(-2, 3, (rows, DIM), generator=gen).float()
    else:  # four +-1 per row, the rest 0: normalised to +-0.5, products exact
        emb = torch.zeros(rows, DIM)
        for r in range(rows):
            cols = torch.randperm(DIM, generator=gen)[:4]
            emb[r, cols] = torch.randint(0, 2, (4,), generator=gen).float() * 2 - 1
    return Table(emb, torch.zeros(rows))


def _tables(comparator: str, exact: bool, rows: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    return {
        ("e", 0): _table(rows, comparator, exact, gen),
        ("e", 1): _table(rows + 5, comparator, exact, gen),
    }


def _edges(n: int, rows: int, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    lhs = torch.randint(rows, (n,), generator=gen)
    rhs = torch.randint(rows, (n,), generator=gen)
    weight = torch.rand(n, generator=gen) + 0.5
    return lhs, rhs, torch.zeros(n, dtype=torch.long), weight


def _both(model, tables, edges, negs, batch_size, sides=SIDES) -> tuple[RankingSums, RankingSums]:
    """The eval with the kernel (which must exist for this model) and without it."""
    lhs, rhs, rel, weight = edges
    kernel = NativeEval.for_model(model, negs)
    assert kernel is not None
    spy = _Spy(kernel)
    args = (model, tables, sides, lhs, rhs, rel, weight, negs, batch_size, 7)
    got, want = evaluate_edges(*args, scorer=spy), evaluate_edges(*args)
    assert spy.scored > 0  # the kernel did score (every enabled unit it supports)
    return got, want


class _Spy:
    """A scorer counting the units its kernel scored."""

    def __init__(self, kernel: NativeEval) -> None:
        self.kernel = kernel
        self.scored = 0

    def side(self, *args):
        out = self.kernel.side(*args)
        self.scored += out is not None
        return out


def _assert_same(got: RankingSums, want: RankingSums) -> None:
    g, w = dataclasses.asdict(got), dataclasses.asdict(want)
    assert g.pop("loss_sum") == pytest.approx(w.pop("loss_sum"), rel=2e-6)
    assert g == w  # counts, and the float sums of equal ranks and AUCs, bit for bit


def _ties_and_masks(model, tables, edges, negs, batch_size) -> tuple[int, int]:
    """Negatives scoring exactly their positive, and masked ones (the premises of a test)."""
    lhs, rhs, rel, weight = edges
    ties = masked = 0
    gen, rng = torch.Generator().manual_seed(7), np.random.default_rng(7)
    for s in score_batches(
        model, lambda k: tables[k].emb, SIDES, lhs, rhs, rel, weight, negs, batch_size, gen, rng
    ):
        for pos, blocks in (
            (s.scores.lhs_pos, s.scores.lhs_neg),
            (s.scores.rhs_pos, s.scores.rhs_neg),
        ):
            for b in blocks:
                ties += int((b == pos.unsqueeze(1)).sum())
                masked += int((b <= -5e8).sum())
    return ties, masked


EXACT_CASES = [
    (comparator, loss, operator)
    for comparator in ("dot", "cos")
    for loss in ("ranking", "softmax", "logistic")
    for operator in ("none", "translation", "diagonal")
]


@needs_kernel
@pytest.mark.parametrize(("comparator", "loss", "operator"), EXACT_CASES)
def test_native_eval_counts_what_the_eager_eval_counts(comparator, loss, operator) -> None:
    model = _model(comparator, loss, operator, glob=comparator == "dot", exact=True)
    tables = _tables(comparator, True, 12)
    edges = _edges(50, 12)
    # batches of 21, 21 and 8 edges: a short last chunk (padding masked), uniform groups of
    # 13 across the chunks of 7
    negs = NegativeSettings(7, 11, 13)
    ties, masked = _ties_and_masks(model, tables, edges, negs, 21)
    assert ties > 50 and masked > 100  # small tables: many exact ties; masks in every row
    got, want = _both(model, tables, edges, negs, 21)
    assert want.count == 100 and 0 < want.hits10 < want.count
    _assert_same(got, want)


NEGS_CASES = [
    NegativeSettings(20, 15, 60),
    NegativeSettings(0, 15, 60),  # uniform negatives only
    NegativeSettings(20, 0, 60),  # batch negatives only
    NegativeSettings(60, 30, 25, disable_lhs=True),  # one chunk per batch, groups of 25
    NegativeSettings(20, 15, 60, disable_rhs=True),
]


@needs_kernel
@pytest.mark.parametrize("negs", NEGS_CASES)
@pytest.mark.parametrize("comparator", ["dot", "cos"])
def test_native_eval_with_each_kind_of_negatives(negs, comparator) -> None:
    model = _model(comparator, "softmax", "diagonal", glob=False, exact=True)
    tables = _tables(comparator, True, 30)
    edges = _edges(130, 30)
    got, want = _both(model, tables, edges, negs, 60)
    assert want.count == 130 * (1 if negs.disable_lhs or negs.disable_rhs else 2)
    _assert_same(got, want)


@needs_kernel
@pytest.mark.parametrize("loss", ["ranking", "softmax", "logistic"])
@pytest.mark.parametrize(("comparator", "operator"), [("cos", "translation"), ("dot", "diagonal")])
def test_native_eval_on_gaussian_tables(comparator, operator, loss) -> None:
    """Operators, global embeddings and cos normalisation with arbitrary values; positives
    are distinct and no uniform draw hits its positive, so no score ties exactly."""
    model = _model(comparator, loss, operator, glob=True, exact=False)
    rows, n = 50_000, 300
    tables = _tables(comparator, False, rows)
    gen = torch.Generator().manual_seed(3)
    lhs, rhs = torch.randperm(rows, generator=gen)[:n], torch.randperm(rows, generator=gen)[:n]
    edges = (lhs, rhs, torch.zeros(n, dtype=torch.long), torch.rand(n, generator=gen) + 0.5)
    negs = NegativeSettings(50, 40, 100)
    ties, _ = _ties_and_masks(model, tables, edges, negs, 100)
    assert ties == 0
    got, want = _both(model, tables, edges, negs, 100)
    assert 0 < want.hits10 < want.count
    _assert_same(got, want)


@needs_kernel
@pytest.mark.parametrize("scale", [1e8, 1e10])
def test_positives_and_negatives_as_low_as_a_mask(scale: float) -> None:
    """Scores at or below -1e9 / 2 are not valid negatives (1e8: some between -1e9 and
    -5e8), and a positive that low is ranked among the valid ones only (the eager path's slow
    rows). Row 3's scores are ``scale`` times small integers: exact in fp32."""
    model = _model("dot", "ranking", "none", glob=False, exact=True)
    tables = _tables("dot", True, 12)
    tables[("e", 0)].emb[3] *= scale
    edges = _edges(50, 12)
    negs = NegativeSettings(7, 11, 13)
    lows = _scores_between(model, tables, edges, negs, 21, -1e9, -5e8)
    assert lows > 0 if scale == 1e8 else lows == 0
    got, want = _both(model, tables, edges, negs, 21)
    _assert_same(got, want)
    assert want.auc_sum < want.count


def _scores_between(model, tables, edges, negs, batch_size, low: float, high: float) -> int:
    """Scores (positive or negative) in (low, high]."""
    lhs, rhs, rel, weight = edges
    count = 0
    gen, rng = torch.Generator().manual_seed(7), np.random.default_rng(7)
    for s in score_batches(
        model, lambda k: tables[k].emb, SIDES, lhs, rhs, rel, weight, negs, batch_size, gen, rng
    ):
        sc = s.scores
        for t in (sc.lhs_pos, sc.rhs_pos, *sc.lhs_neg, *sc.rhs_neg):
            count += int(((t > low) & (t <= high)).sum())
    return count


def test_no_kernel_means_the_eager_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the library (no compiler, ``BIGEMBED_NATIVE=0``) training's eval gets no
    scorer, in this process or in the Hogwild workers."""
    monkeypatch.setattr(native_eval, "native_library", lambda: None)
    model = _model("cos", "ranking", "none", glob=False, exact=False)
    assert NativeEval.for_model(model, NegativeSettings(7, 11, 13)) is None


def _one(operator: str = "none", **extra) -> ModelSpec:
    return ModelSpec(relations=(RelationSpec("e", "e", operator),), entity_dims={"e": DIM}, **extra)


@pytest.mark.parametrize(
    "spec",
    [
        _one(bias=True),
        _one(comparator="l2"),
        _one(compute_dtype="bfloat16"),
        _one("diagonal", dynamic_relations=True, num_dynamic_relations=3),
    ],
    ids=["bias", "l2", "bf16", "dynamic"],
)
def test_models_outside_the_kernel_take_the_eager_eval(spec: ModelSpec) -> None:
    assert NativeEval.for_model(ScoringModel(spec), NegativeSettings(7, 11, 13)) is None


@needs_kernel
def test_units_outside_the_kernel_take_the_eager_eval() -> None:
    """A relation whose operator the kernel does not know (complex_diagonal) or that ranks
    against all entities is scored eagerly; the model's other relation natively."""
    spec = ModelSpec(
        relations=(
            RelationSpec("e", "e", "complex_diagonal"),
            RelationSpec("e", "e", "none", all_negs=True),
            RelationSpec("e", "e", "translation"),
        ),
        entity_dims={"e": DIM},
        comparator="dot",
    )
    model = ScoringModel(spec)
    negs = NegativeSettings(7, 11, 13)
    kernel = NativeEval.for_model(model, negs)
    assert kernel is not None
    tables = _tables("dot", True, 12)
    emb0, emb1 = tables[("e", 0)].emb, tables[("e", 1)].emb
    idx, uni = np.arange(10), np.zeros(11, dtype=np.int64)
    assert kernel.side(0, 0, emb0, emb1, idx, idx, uni) is None
    assert kernel.side(1, 0, emb0, emb1, idx, idx, None) is None
    assert kernel.side(2, 0, emb0, emb1, idx, idx, uni) is not None
    assert kernel.side(2, 0, emb0.double(), emb1, idx, idx, uni) is None
    lhs, rhs, _, weight = _edges(60, 12)
    rel = torch.arange(60) % 3
    got, want = _both(model, tables, (lhs, rhs, rel, weight), negs, 21, SIDES * 3)
    _assert_same(got, want)


def test_an_eval_given_a_runner_runs_its_units_there() -> None:
    """``run_units`` (training's Hogwild pool) ranks the units, not this process."""
    model = _model("cos", "ranking", "none", glob=False, exact=False)
    tables = _tables("cos", False, 40)
    lhs, rhs, rel, weight = _edges(50, 40)
    negs = NegativeSettings(7, 11, 13)
    plans = []

    def runner(plan):
        plans.append(plan)
        from bigembed.ranking.sampled import eval_unit

        return [eval_unit(model, lambda k: tables[k].emb, SIDES, plan, u) for u in range(6)]

    got = evaluate_edges(model, tables, SIDES, lhs, rhs, rel, weight, negs, 21, 7, runner)
    assert len(plans) == 1 and plans[0].num_units == 6
    plan = plan_eval(
        model, lambda k: tables[k].emb.shape[0], SIDES, lhs, rhs, rel, weight, negs, 21, 7
    )
    want = evaluate_edges(model, tables, SIDES, lhs, rhs, rel, weight, negs, 21, 7)
    assert dataclasses.asdict(got) == dataclasses.asdict(want)
    assert merge_units(model, plan, runner(plan)) == want
