"""The relation-prediction auxiliary objective (``relation_prediction_weight``): each edge's
relation ranked by a softmax over all relation types, added to the 1vsAll/KvsAll loss."""

from __future__ import annotations

import math

import pytest
import torch

from bigembed.buckets.batching import Batch
from bigembed.config import model_spec, parse_config_dict
from bigembed.errors import ConfigError
from bigembed.model import QueryBatch, ScoringModel, SideEmbeddings
from bigembed.model import scoring as scoring_module
from bigembed.model.relation_prediction import general_relation_scores, relation_scores
from bigembed.model.spec import ModelSpec, RelationSpec
from support.steps import NO_NEGATIVES as ALL
from support.steps import fresh_tables, fresh_trainer, perturbed_model


def _distmult(weight: float) -> ScoringModel:
    """DistMult, d=2, 2 relations: diagonals (1, 2) and (3, -1), dot comparator, no N3."""
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", "diagonal", all_negs=True),),
        entity_dims={"e": 2},
        comparator="dot",
        loss="softmax",
        global_emb=False,
        dynamic_relations=True,
        num_dynamic_relations=2,
        relation_prediction_weight=weight,
    )
    model = ScoringModel(spec)
    with torch.no_grad():
        model.lhs_operators[0].diagonal.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))
    return model


def _hand_value(weight: float) -> float:
    """Edge h = (1, 0.5), t = (2, 1), relation 1, edge weight 0.5: scores
    r0: 1*2*1 + 0.5*1*2 = 3, r1: 1*2*3 + 0.5*1*(-1) = 5.5; CE of r1 = log(e^3 + e^5.5) - 5.5."""
    return weight * 0.5 * (math.log(math.exp(3.0) + math.exp(5.5)) - 5.5)


def _query_loss(model: ScoringModel) -> float:
    table = torch.tensor([[1.0, 0.5], [2.0, 1.0], [0.0, 1.0]])
    leaves = [x.clone().requires_grad_() for x in (table[[0]], table, table[[1]])]
    queries = QueryBatch(
        "rhs",
        leaves[0],
        torch.tensor([1]),
        leaves[1],
        leaves[2],
        torch.tensor([1]),
        torch.tensor([0]),
        torch.tensor([1]),
        torch.tensor([0.5]),
    )
    return float(model.query_loss(queries).loss.detach())


def _one_vs_all_loss(model: ScoringModel) -> float:
    table = torch.tensor([[1.0, 0.5], [2.0, 1.0], [0.0, 1.0]])

    def side(idx: int) -> SideEmbeddings:
        return SideEmbeddings(
            table[[idx]].clone().requires_grad_(), torch.tensor([idx]), None, table.clone()
        )

    scores = model(
        side(0), side(1), torch.tensor([1]), 0, torch.tensor([0.5]), ALL, need_scores=False
    )
    return float(scores.loss.detach())


@pytest.mark.parametrize("loss_of", [_query_loss, _one_vs_all_loss])
def test_loss_adds_the_hand_computed_relation_cross_entropy(loss_of) -> None:  # type: ignore[no-untyped-def]
    """KvsAll's tail-query loss and 1vsAll's loss grow by exactly weight x the hand-computed
    cross-entropy of the edge's relation among the two relations."""
    base = loss_of(_distmult(0.0))
    for weight in (0.7, 2.0):
        assert loss_of(_distmult(weight)) - base == pytest.approx(_hand_value(weight), rel=1e-5)


@pytest.mark.parametrize("operator", ["complex_diagonal", "diagonal", "translation"])
@pytest.mark.parametrize("comparator", ["dot", "cos"])
def test_relation_scores_equal_the_operator_applied_to_every_relation(
    operator: str, comparator: str
) -> None:
    """The relation scores (the (h ∘ t) product for DistMult/ComplEx with dot) and their
    gradients equal those of each relation's operator applied to h and compared with t; for
    ComplEx they are the features (h ∘ conj t) times every relation's parameters."""
    model = perturbed_model(operator, comparator)
    op, cmp = model.lhs_operator(), model.comparator
    h0, t0 = torch.randn(5, 8), torch.randn(5, 8)
    got, ref = [], []
    for fn, out in ((relation_scores, got), (general_relation_scores, ref)):
        model.zero_grad()
        h, t = h0.clone().requires_grad_(), t0.clone().requires_grad_()
        scores = fn(op, cmp, h, cmp.prepare(t), 3)
        (scores * torch.arange(15.0).view(5, 3)).sum().backward()
        out += [scores.detach(), h.grad, t.grad]
        out += [p.grad.clone() for p in op.parameters()]
    for a, b in zip(got, ref, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    if operator == "complex_diagonal" and comparator == "dot":
        hr, hi, tr, ti = h0[:, :4], h0[:, 4:], t0[:, :4], t0[:, 4:]
        feats = torch.cat([hr * tr + hi * ti, hr * ti - hi * tr], 1)
        params = torch.cat([op.real, op.imag], 1).detach()
        assert torch.allclose(got[0], feats @ params.t(), atol=1e-5)


def _spec(weight: float) -> ModelSpec:
    return ModelSpec(
        relations=(RelationSpec("e", "e", "complex_diagonal", all_negs=True),),
        entity_dims={"e": 6},
        comparator="dot",
        loss="softmax",
        regularization_coef=0.01,
        global_emb=False,
        dynamic_relations=True,
        num_dynamic_relations=3,
        relation_prediction_weight=weight,
    )


def test_weight_zero_never_computes_it_and_a_weight_moves_relations_and_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A KvsAll tail-query step on relation 0 only: with weight 0 the objective is never
    computed (so training is bit-for-bit as before); with a weight the parameters of the
    relations absent from the batch move (only the relation softmax reaches them) and the
    entity rows end elsewhere."""
    torch.manual_seed(4)
    emb = torch.randn(5, 6) * 0.3
    lidx, ridx = torch.randint(5, (8,)), torch.randint(5, (8,))
    rel = torch.zeros(8, dtype=torch.long)
    tables = fresh_tables(emb, emb, True)
    results = {}
    for weight in (0.0, 1.0):
        trainer = fresh_trainer(_spec(weight))()
        if weight == 0.0:
            monkeypatch.setattr(scoring_module, "relation_prediction_loss", None)
        else:
            monkeypatch.undo()
        before = [p.detach().clone() for p in trainer.model.parameters()]
        lhs, rhs = tables()
        trainer.step(Batch(lidx, ridx, rel, 0, None, "rhs"), lhs, rhs)
        after = list(trainer.model.parameters())
        moved = [not torch.equal(a[1:], b[1:]) for a, b in zip(before, after, strict=True)]
        results[weight] = (any(moved), lhs.emb.clone())
    assert results[0.0][0] is False  # relations 1, 2 untouched without the objective
    assert results[1.0][0] is True
    assert not torch.equal(results[0.0][1], results[1.0][1])


def test_config_key_reaches_the_model_and_needs_all_entity_softmax_training() -> None:
    """The key reaches the model spec; where it would act nowhere the config fails in one
    line naming it."""
    base = {
        "entities": {"a": {"num_partitions": 1}},
        "relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "complex_diagonal"}],
        "dynamic_relations": True,
        "global_emb": False,
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "m",
        "dimension": 8,
        "loss_fn": "softmax",
        "comparator": "dot",
        "train_type": "KvsAll",
    }
    cfg = parse_config_dict({**base, "relation_prediction_weight": 0.5})
    assert model_spec(cfg, 2).relation_prediction_weight == 0.5
    assert model_spec(parse_config_dict(base), 2).relation_prediction_weight == 0
    for extra in (
        {"train_type": "negative_sampling"},
        {"train_type": "1vsAll", "loss_fn": "ranking"},
        {"relation_prediction_weight": -1.0},
    ):
        bad = {**base, "relation_prediction_weight": 0.5, **extra}
        with pytest.raises(ConfigError, match="relation_prediction_weight") as info:
            parse_config_dict(bad, "x.yaml")
        assert "\n" not in str(info.value)
