"""The query entity as a negative in sampled training (config key ``self_negative``)."""

from __future__ import annotations

import math

import pytest
import torch

from bigembed.model import ModelSpec, NegativeSettings, RelationSpec, ScoringModel, SideEmbeddings


def _model(lhs: str = "e", rhs: str = "e", operator: str = "none") -> ScoringModel:
    dims = {lhs: 2, rhs: 2}
    spec = ModelSpec(
        relations=(RelationSpec(lhs, rhs, operator),),
        entity_dims=dims,
        comparator="dot",
        loss="softmax",
        global_emb=False,
    )
    return ScoringModel(spec)


def _negs(self_negative: bool | str, uniform: int = 0) -> NegativeSettings:
    return NegativeSettings(
        num_batch_negs=0, num_uniform_negs=uniform, uniform_group=3, self_negative=self_negative
    )


# Rows 0 and 1: h = (1, 0), t = (0, 1) at different offsets; row 2: h == t = (1, 1).
HEADS = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
TAILS = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
HEAD_IDX = torch.tensor([0, 0, 5])
TAIL_IDX = torch.tensor([1, 1, 5])


def _loss(model: ScoringModel, negs: NegativeSettings, need_scores: bool = True) -> float:
    torch.manual_seed(0)
    uniform = None
    if negs.num_uniform_negs:
        uniform = torch.randn(1, negs.num_uniform_negs, 2)
    lhs = SideEmbeddings(HEADS.clone(), HEAD_IDX, uniform)
    rhs = SideEmbeddings(TAILS.clone(), TAIL_IDX, uniform)
    rel = torch.zeros(3, dtype=torch.long)
    out = model(lhs, rhs, rel, 0, None, negs, need_scores=need_scores)
    return float(out.loss.detach())


def test_query_entity_is_scored_as_a_negative_hand_computed() -> None:
    # Only the query-entity column: rows 0 and 1 score pos h.t = 0 against |h|^2 = 1 (tail
    # corrupted) and |t|^2 = 1 (head corrupted): log(1 + e) per side. Row 2 has h == t: its
    # column is masked, leaving softmax over the positive alone: loss 0.
    model = _model()
    expected = 2 * 2 * math.log(1 + math.e)
    assert _loss(model, _negs(True)) == pytest.approx(expected, rel=1e-6)
    assert _loss(model, _negs(False)) == pytest.approx(0.0, abs=1e-6)


def test_candidates_go_through_the_operator_of_the_corrupted_side() -> None:
    # A translation operator transforms rhs candidates: corrupting the tail scores h against
    # op(h) = h + v, like every tail negative; corrupting the head scores t raw against op(t).
    model = _model(operator="translation")
    with torch.no_grad():
        model.rhs_operator(0).translation.copy_(torch.tensor([0.5, -1.0]))
    v = torch.tensor([0.5, -1.0])
    total = 0.0
    for h, t, same in zip(HEADS, TAILS, (False, False, True), strict=True):
        pos = float(h @ (t + v))
        negs_rhs = [] if same else [float(h @ (h + v))]
        negs_lhs = [] if same else [float(t @ (t + v))]
        for negs in (negs_rhs, negs_lhs):
            total += -pos + math.log(sum(math.exp(x) for x in [pos, *negs]))
    assert _loss(model, _negs(True)) == pytest.approx(total, rel=1e-5)


def test_auto_is_on_within_one_type_and_off_across_types() -> None:
    same, across = _model("e", "e"), _model("a", "b")
    assert same.self_negative(_negs("auto"), 0)
    assert not across.self_negative(_negs("auto"), 0)
    assert across.self_negative(_negs(True), 0)
    assert _loss(across, _negs("auto")) == pytest.approx(_loss(across, _negs(False)))
    assert _loss(same, _negs("auto")) == pytest.approx(_loss(same, _negs(True)))


def test_training_path_with_uniform_negatives_keeps_the_column() -> None:
    # With uniform negatives the fused loss would run; it has no query-entity column, so the
    # training call (need_scores=False) must give the score-block loss that includes it.
    model = _model()
    with_col = _loss(model, _negs(True, uniform=4), need_scores=True)
    assert _loss(model, _negs(True, uniform=4), need_scores=False) == pytest.approx(with_col)
    assert with_col > _loss(model, _negs(False, uniform=4), need_scores=True)


def test_config_key_reaches_training_not_evaluation() -> None:
    from bigembed.buckets import negative_settings
    from bigembed.config import ConfigSchema

    cfg = ConfigSchema.model_validate(
        {
            "entity_path": "x",
            "edge_paths": ["y"],
            "checkpoint_path": "z",
            "entities": {"e": {"num_partitions": 1}},
            "relations": [{"name": "r", "lhs": "e", "rhs": "e"}],
            "dimension": 2,
            "self_negative": False,
        }
    )
    assert negative_settings(cfg).self_negative is False
    assert ConfigSchema.model_validate({**cfg.model_dump(), "self_negative": "auto"})
    assert negative_settings(cfg, for_eval=True).self_negative is False


def test_native_kernel_takes_it() -> None:
    """The native step has the column (tests/test_native_step.py compares it with the eager
    step): the option keeps the kernel, whichever way it is set."""
    from bigembed.kernels.native.step import unsupported

    for self_negative in ("auto", True, False):
        assert unsupported(_model(), _negs(self_negative, uniform=4)) is None


@pytest.mark.parametrize(
    ("comparator", "dynamic", "operator", "loss"),
    [
        ("dot", True, "complex_diagonal", "softmax"),
        ("dot", False, "translation", "softmax"),
        ("cos", False, "diagonal", "logistic"),
        ("cos", False, "none", "ranking"),
        ("dot", True, "diagonal", "ranking"),
    ],
)
def test_fused_loss_has_the_column(
    comparator: str, dynamic: bool, operator: str, loss: str
) -> None:
    """Training's fused loss (need_scores=False) equals the score blocks with the query-entity
    column: loss, gradients of every row and parameter, violators; one edge is a self-loop."""
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", operator),),
        entity_dims={"e": 8},
        comparator=comparator,
        loss=loss,
        global_emb=True,
        dynamic_relations=dynamic,
        num_dynamic_relations=5,
    )
    torch.manual_seed(0)
    model = ScoringModel(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    negs = NegativeSettings(4, 6, 5, self_negative=True)
    n = 10
    heads, tails = torch.randn(n, 8), torch.randn(n, 8)
    tails[3] = heads[3]  # a self-loop: its column is masked
    idx = torch.arange(n)
    leaves = [heads, torch.randn(2, 6, 8), tails, torch.randn(2, 6, 8)]
    rel = torch.randint(5, (n,)) if dynamic else torch.zeros(n, dtype=torch.long)
    weight = torch.rand(n) + 0.5

    def run(need_scores: bool):  # type: ignore[no-untyped-def]
        xs = [x.clone().requires_grad_() for x in leaves]
        model.zero_grad()
        lhs = SideEmbeddings(xs[0], idx, xs[1])
        rhs = SideEmbeddings(xs[2], idx, xs[3])
        out = model(lhs, rhs, rel, 0, weight, negs, need_scores=need_scores)
        (2.0 * out.loss).backward()
        grads = [x.grad for x in xs] + [p.grad.clone() for p in model.parameters()]
        return out, grads

    (blocks, block_grads), (fused, fused_grads) = run(True), run(False)
    assert fused.fused_violators is not None and fused.lhs_neg == []
    assert [b.shape[1] for b in blocks.rhs_neg][-1] == 1  # the score blocks have the column
    assert float(fused.loss) == pytest.approx(float(blocks.loss), rel=1e-5)
    for ref, got in zip(block_grads, fused_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    assert fused.violators() == blocks.violators()
