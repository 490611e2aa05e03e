"""Model pieces on fixed tensors: losses (PBG's reference values), operators, comparators."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from bigembed.model.comparators import make_comparator
from bigembed.model.losses import logistic_loss, ranking_loss, softmax_loss
from bigembed.model.negatives import MASKED, batch_negative_scores, shared_negative_scores
from bigembed.model.operators import OPERATORS, make_operator
from bigembed.model.spec import ModelSpec, RelationSpec

POS = torch.tensor([0.8181, 0.5700, 0.3506])
NEG = torch.tensor(
    [
        [0.4437, 0.6573, 0.9986, 0.2548, 0.0998],
        [0.6175, 0.4061, 0.4582, 0.5382, 0.3126],
        [0.9869, 0.2028, 0.1667, 0.0044, 0.9934],
    ]
)
W = torch.tensor([0.2, 0.4, 0.0])


def test_loss_reference_values() -> None:
    assert float(logistic_loss(POS, NEG, None)) == pytest.approx(4.2589, abs=1e-4)
    assert float(ranking_loss(POS, NEG, None, 1.0)) == pytest.approx(13.4475, abs=1e-4)
    assert float(softmax_loss(POS, NEG, None)) == pytest.approx(5.2513, abs=1e-4)
    assert float(logistic_loss(POS, NEG, W)) == pytest.approx(0.8302, abs=1e-4)
    assert float(ranking_loss(POS, NEG, W, 1.0)) == pytest.approx(2.4658, abs=1e-4)
    assert float(softmax_loss(POS, NEG, W)) == pytest.approx(0.9978, abs=1e-4)


def test_loss_edge_cases() -> None:
    zeros = torch.zeros(3)
    assert float(logistic_loss(zeros, torch.empty(3, 0), None)) == pytest.approx(3 * math.log(2))
    empty = torch.empty(0)
    for loss in (logistic_loss, softmax_loss):
        assert float(loss(empty, torch.empty(0, 5), None)) == 0.0
    assert float(ranking_loss(empty, torch.empty(0, 5), None, 0.1)) == 0.0
    big = torch.tensor([1e9, -1e9])
    neg = torch.tensor([[-1e9], [1e9]])
    for loss in (logistic_loss, softmax_loss):
        assert torch.isfinite(loss(big, neg, None))


def test_softmax_gradient_matches_autograd_reference() -> None:
    pos = torch.randn(6, requires_grad=True)
    neg = torch.randn(6, 4, requires_grad=True)
    softmax_loss(pos, neg, W.repeat(2)).backward()
    got = pos.grad.clone(), neg.grad.clone()
    pos.grad = neg.grad = None
    ref = (torch.logsumexp(torch.cat((pos[:, None], neg), 1), 1) - pos) * W.repeat(2)
    ref.sum().backward()
    assert torch.allclose(got[0], pos.grad) and torch.allclose(got[1], neg.grad)


def test_operators_on_fixed_tensors() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    op = make_operator("translation", 4)
    op.translation.data = torch.tensor([1.0, 0.0, -1.0, 0.5])
    assert op(x).tolist() == [[2.0, 2.0, 2.0, 4.5]]
    op = make_operator("diagonal", 4)
    op.diagonal.data = torch.tensor([2.0, 0.0, 1.0, -1.0])
    assert op(x).tolist() == [[2.0, 0.0, 3.0, -4.0]]
    op = make_operator("linear", 4)
    op.linear_transformation.data = torch.arange(16.0).view(4, 4)
    assert torch.allclose(op(x), x @ torch.arange(16.0).view(4, 4).t())
    op = make_operator("affine", 4)
    assert torch.allclose(op(x), x)  # identity init
    op = make_operator("complex_diagonal", 4)
    op.real.data = torch.tensor([0.0, 1.0])
    op.imag.data = torch.tensor([1.0, 0.0])
    # (1 + 3i) * i = -3 + i ; (2 + 4i) * 1 = 2 + 4i  -> [re | im] = [-3, 2 | 1, 4]
    assert op(x).tolist() == [[-3.0, 2.0, 1.0, 4.0]]
    assert make_operator("none", 4)(x) is x


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_dynamic_operator_rows_match_standard(name: str) -> None:
    torch.manual_seed(0)
    dyn = make_operator(name, 4, num_relations=3)
    for p in dyn.parameters():
        p.data.normal_()
    x = torch.randn(5, 4)
    rel = torch.tensor([0, 2, 1, 2, 0])
    out = dyn(x, rel)
    for k in range(5):
        std = make_operator(name, 4)
        for (_, ps), (_, pd) in zip(std.named_parameters(), dyn.named_parameters(), strict=True):
            ps.data = pd.data[rel[k]].clone()
        assert torch.allclose(out[k], std(x[k : k + 1])[0], atol=1e-6)


def test_cos_prepare_matches_normalize_and_its_gradient() -> None:
    """The cos comparator's fused normalisation: F.normalize's values and gradients, also on a
    zero row, a row whose norm is clamped to eps, and a batched (G, N, D) input."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 7, dtype=torch.float64)
    x[0, 3] = 0.0
    x[1, 2] *= 3e-14 / float(x[1, 2].norm())  # below eps = 1e-12: divided by eps, not its norm
    upstream = torch.randn_like(x)
    grads = []
    for fn in (make_comparator("cos").prepare, lambda t: torch.nn.functional.normalize(t, dim=-1)):
        leaf = x.clone().requires_grad_()
        y = fn(leaf)
        (y * upstream).sum().backward()
        grads.append((y.detach(), leaf.grad))
    (y_got, g_got), (y_ref, g_ref) = grads
    assert torch.allclose(y_got, y_ref) and torch.allclose(g_got, g_ref)


def test_comparators_on_fixed_tensors() -> None:
    a = torch.tensor([[[1.0, 0.0, 2.0]]])  # (1, 1, 3)
    b = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, -1.0]]])  # (1, 2, 3)
    dot = make_comparator("dot")
    assert dot.neg(a, b).tolist() == [[[1.0, -2.0]]]
    assert dot.pos(a[0], b[0, :1]).tolist() == [1.0]
    cos = make_comparator("cos")
    got = cos.neg(cos.prepare(a), cos.prepare(b))
    assert torch.allclose(got, torch.tensor([[[1 / math.sqrt(10), -2 / math.sqrt(5)]]]))
    sq = make_comparator("squared_l2")
    assert torch.allclose(sq.neg(a, b), torch.tensor([[[-5.0, -10.0]]]))
    l2 = make_comparator("l2")
    assert torch.allclose(l2.neg(a, b), torch.tensor([[[-math.sqrt(5), -math.sqrt(10)]]]))
    assert torch.allclose(l2.pos(a[0], b[0, :1]), torch.tensor([-math.sqrt(5)]))
    biased = make_comparator("dot", bias=True)
    # bias: coordinate 0 of each side is added, the rest is compared
    assert biased.neg(a, b).tolist() == [[[2.0, -1.0]]]
    assert biased.pos(a[0], b[0, :1]).tolist() == [2.0]


def test_batch_negatives_mask_self_and_padding() -> None:
    cmp = make_comparator("dot")
    anchors = torch.randn(5, 3)
    src = torch.randn(5, 3)
    scores = batch_negative_scores(cmp, anchors, src, 2, torch.float32)
    assert scores.shape == (5, 2)
    # rows 0,1 form chunk 0: row 0's column 0 is itself (masked), column 1 is src[1]
    assert scores[0, 0] == MASKED and scores[1, 1] == MASKED
    assert torch.isclose(scores[0, 1], anchors[0] @ src[1])
    # the last chunk holds only row 4: its column 1 is padding
    assert scores[4, 0] == MASKED and scores[4, 1] == MASKED


def test_shared_negatives_groups() -> None:
    cmp = make_comparator("dot")
    anchors = torch.randn(5, 3)
    negs = torch.randn(3, 4, 3)  # 3 groups of 2 anchors (last one padded)
    scores = shared_negative_scores(cmp, anchors, negs, 2, torch.float32)
    assert scores.shape == (5, 4)
    assert torch.allclose(scores[3], negs[1] @ anchors[3])
    assert torch.allclose(scores[4], negs[2] @ anchors[4])


# --------------------------------------------------------------------------- fused training loss


UNFUSED_LOSSES = {
    "softmax": softmax_loss,
    "ranking": lambda pos, blocks, weight: ranking_loss(pos, blocks, weight, 0.3),
    "logistic": logistic_loss,
}


@pytest.mark.parametrize("kind", list(UNFUSED_LOSSES))
@pytest.mark.parametrize(
    ("batch", "group", "chunk", "weighted", "num_negs"),
    [
        (1000, 1000, 50, False, 40),  # one group, chunks divide the batch
        (130, 50, 50, True, 40),  # PBG-style per-chunk groups, last group short
        (997, 997, 50, True, 300),  # padded last chunk, more tiles than one
        (30, 30, 50, False, 8),  # batch smaller than a chunk
        (600, 600, 0, False, 40),  # no batch negatives
    ],
)
def test_fused_loss_matches_unfused(
    kind: str, batch: int, group: int, chunk: int, weighted: bool, num_negs: int
) -> None:
    """The tiled kernel gives the unfused loss, gradients and violator count."""
    from bigembed.model import fused as fused_module
    from bigembed.model.fused import fused_sampled_loss

    torch.manual_seed(batch)
    cmp = make_comparator("dot")
    groups = -(-batch // group)
    pos = torch.randn(batch, requires_grad=True)
    anchors = torch.randn(batch, 16, requires_grad=True)
    src = torch.randn(batch, 16, requires_grad=True)
    negs = torch.randn(groups, num_negs, 16, requires_grad=True)
    weight = torch.rand(batch) if weighted else None
    leaves = (pos, anchors, src, negs)

    def run(fused: bool) -> tuple[float, int, list[torch.Tensor]]:
        for t in leaves:
            t.grad = None
        if fused:
            with mock.patch.object(fused_module, "TILE_SCORES", 2000):  # several tiles per group
                loss, violators = fused_sampled_loss(
                    pos,
                    anchors,
                    negs,
                    group,
                    weight,
                    torch.float32,
                    src if chunk else None,
                    chunk,
                    kind,
                    0.3,
                )
        else:
            blocks = [shared_negative_scores(cmp, anchors, negs, group, torch.float32)]
            if chunk:
                blocks.insert(0, batch_negative_scores(cmp, anchors, src, chunk, torch.float32))
            loss = UNFUSED_LOSSES[kind](pos, blocks, weight)
            violators = sum(int((b > pos.detach().unsqueeze(1)).sum()) for b in blocks)
        (3.0 * loss).backward()  # a non-unit upstream gradient
        grads = [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in leaves]
        return float(loss.detach()), violators, grads

    (ref_loss, ref_viol, ref_grads), (loss, viol, grads) = run(False), run(True)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert viol == ref_viol
    for ref, got in zip(ref_grads, grads, strict=True):
        assert torch.allclose(ref, got, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("comparator", "dynamic", "operator", "loss"),
    [
        ("dot", True, "complex_diagonal", "softmax"),
        ("cos", True, "diagonal", "softmax"),
        ("dot", False, "translation", "softmax"),
        ("cos", False, "diagonal", "softmax"),
        ("cos", False, "none", "ranking"),
        ("dot", True, "complex_diagonal", "ranking"),
        ("cos", False, "diagonal", "logistic"),
    ],
)
def test_training_uses_fused_loss_with_same_value(
    comparator: str, dynamic: bool, operator: str, loss: str
) -> None:
    """need_scores=False (training) and the score-block path agree on loss, gradients and
    violators, in both relation modes (standard mode sends rhs negatives through the operator)."""
    from bigembed.model import NegativeSettings, ScoringModel, SideEmbeddings

    spec = ModelSpec(
        relations=(RelationSpec("e", "e", operator),),
        entity_dims={"e": 8},
        comparator=comparator,
        loss=loss,
        regularization_coef=0.01,
        global_emb=False,
        dynamic_relations=dynamic,
        num_dynamic_relations=5,
    )
    torch.manual_seed(0)
    model = ScoringModel(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    negs = NegativeSettings(num_batch_negs=4, num_uniform_negs=6, uniform_group=10)
    n = 10
    leaves = [torch.randn(n, 8), torch.randn(1, 6, 8), torch.randn(n, 8), torch.randn(1, 6, 8)]
    rel = torch.randint(5, (n,)) if dynamic else torch.zeros(n, dtype=torch.long)

    def run(need_scores: bool):  # type: ignore[no-untyped-def]
        xs = [x.clone().requires_grad_() for x in leaves]
        model.zero_grad()
        lhs = SideEmbeddings(xs[0], torch.arange(n), xs[1])
        rhs = SideEmbeddings(xs[2], torch.arange(n), xs[3])
        out = model(lhs, rhs, rel, 0, None, negs, need_scores=need_scores)
        (out.loss + out.reg).backward()
        grads = [x.grad for x in xs] + [p.grad.clone() for p in model.parameters()]
        return out, grads

    (full, full_grads), (fused, fused_grads) = run(True), run(False)
    assert fused.lhs_neg == [] and fused.fused_violators is not None
    assert float(fused.loss.detach()) == pytest.approx(float(full.loss.detach()), rel=1e-5)
    assert float(fused.reg.detach()) == pytest.approx(float(full.reg.detach()), rel=1e-6)
    for ref, got in zip(full_grads, fused_grads, strict=True):
        assert torch.allclose(ref, got, atol=1e-5, rtol=1e-4)
    for pos, blocks, count in (
        (full.lhs_pos, full.lhs_neg, fused.violators()[0]),
        (full.rhs_pos, full.rhs_neg, fused.violators()[1]),
    ):
        assert count == sum(int((b > pos.detach().unsqueeze(1)).sum()) for b in blocks)


@pytest.mark.parametrize("name", ["translation", "diagonal", "complex_diagonal"])
def test_dynamic_reg_params_sum_counts_each_edge(name: str) -> None:
    """bincount weighting equals gathering one parameter row per edge."""
    op = make_operator(name, 6, num_relations=4)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.randn_like(p))
    rel = torch.tensor([0, 2, 2, 3, 2, 0])
    expected = op.reg_params(rel).pow(3).sum()
    assert float(op.reg_params_sum(rel).detach()) == pytest.approx(
        float(expected.detach()), rel=1e-6
    )
    whole = op.reg_params(None).pow(3).sum()
    assert float(op.reg_params_sum(None).detach()) == pytest.approx(float(whole.detach()), rel=1e-6)


def _relation_spec(scale: float | None, seed: int = 0, dynamic: bool = True) -> ModelSpec:
    ops = ("diagonal", "complex_diagonal", "translation", "linear")
    relations = (
        (RelationSpec("a", "a", "complex_diagonal"),)
        if dynamic
        else tuple(RelationSpec("a", "a", op) for op in ops)
    )
    return ModelSpec(
        relations=relations,
        entity_dims={"a": 8},
        comparator="dot",
        loss="softmax",
        global_emb=False,
        dynamic_relations=dynamic,
        num_dynamic_relations=5,
        relation_init_scale=scale,
        seed=seed,
    )


def test_operators_start_as_the_identity_by_default() -> None:
    """relation_init_scale null keeps PBG's start: every operator leaves x unchanged."""
    from bigembed.model.scoring import ScoringModel

    x = torch.randn(3, 8)
    for dynamic in (True, False):
        model = ScoringModel(_relation_spec(None, dynamic=dynamic))
        for op in (*model.lhs_operators, *model.rhs_operators):
            rel = torch.tensor([0, 4, 2]) if dynamic else None
            assert torch.equal(op(x, rel), x), type(op).__name__


def test_random_relation_init_is_seeded_and_scaled() -> None:
    """relation_init_scale draws every operator parameter from N(0, scale^2): reproducible
    from the seed (every process building the model gets the same operators), different per
    seed, different between the two directions of a dynamic relation."""
    from bigembed.model.scoring import ScoringModel

    for dynamic in (True, False):
        one, same = (ScoringModel(_relation_spec(0.5, 7, dynamic)) for _ in range(2))
        other = ScoringModel(_relation_spec(0.5, 8, dynamic))
        params = list(one.parameters())
        assert params
        for a, b, c in zip(params, same.parameters(), other.parameters(), strict=True):
            assert torch.equal(a, b) and not torch.equal(a, c)
        flat = torch.cat([p.detach().flatten() for p in params])
        assert abs(float(flat.mean())) < 0.1
        assert float(flat.std()) == pytest.approx(0.5, rel=0.2)
    model = ScoringModel(_relation_spec(1e-3, 0))
    lhs, rhs = model.lhs_operators[0], model.rhs_operators[0]
    assert not torch.equal(lhs.real, rhs.real)
    assert float(lhs.real.detach().abs().max()) < 1e-2


def test_relation_init_scale_config() -> None:
    """The key reaches the model spec with the seed; zero or negative is refused in one line."""
    from bigembed.config import model_spec, parse_config_dict
    from bigembed.errors import ConfigError

    base = {
        "entities": {"a": {"num_partitions": 1}},
        "relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "diagonal"}],
        "dimension": 4,
        "entity_path": "e",
        "edge_paths": ["p"],
        "checkpoint_path": "c",
    }
    assert model_spec(parse_config_dict(base)).relation_init_scale is None
    spec = model_spec(parse_config_dict({**base, "relation_init_scale": 0.01, "seed": 3}))
    assert (spec.relation_init_scale, spec.seed) == (0.01, 3)
    for bad in (0, -1.0, "big"):
        with pytest.raises(ConfigError, match="relation_init_scale") as info:
            parse_config_dict({**base, "relation_init_scale": bad}, "x.yaml")
        assert "\n" not in str(info.value)
