"""Entity dropout on the query side (``entity_dropout``) and the factor form of N3
(``regularizer: N3_factors``): the math of both, on the grouped (KvsAll) and per-edge paths."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from bigembed.buckets.batching import Batch
from bigembed.config import model_spec, parse_config_dict
from bigembed.errors import ConfigError
from bigembed.model import NegativeSettings, QueryBatch, ScoringModel, SideEmbeddings
from bigembed.model.all_entities import all_entity_softmax_loss
from support.steps import fresh_tables, fresh_trainer, perturbed_model

P = 0.4
NEGS = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=8)


def _model(**fields: Any) -> ScoringModel:
    return perturbed_model("complex_diagonal", **fields)


def _data(seed: int = 1, rows: int = 6, n: int = 25) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(rows, 8, generator=gen)
    lidx = torch.randint(rows, (n,), generator=gen)
    ridx = torch.randint(rows, (n,), generator=gen)
    rel = torch.randint(3, (n,), generator=gen)
    return table, lidx, ridx, rel


def _tail_queries(table: torch.Tensor, lidx, ridx, rel) -> QueryBatch:  # type: ignore[no-untyped-def]
    keys, inverse = torch.unique(lidx * 3 + rel, return_inverse=True)
    return QueryBatch(
        "rhs", table[keys // 3], keys % 3, table, table[ridx], ridx, inverse, rel, None
    )


def _mask(shape: torch.Size, seed: int) -> torch.Tensor:
    """The inverted-dropout multiplier the model draws first from a generator seeded ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.empty(shape).bernoulli_(1 - P, generator=gen) / (1 - P)


def test_query_dropout_masks_the_given_entities_in_training_only() -> None:
    """KvsAll: with a generator the loss is the undropped model's loss on the given rows times
    an inverted-dropout mask drawn from it (one mask per distinct query); the N3 term is the
    undropped one; the same seed gives the same loss, another seed another; without a
    generator (evaluation) dropout is off."""
    table, lidx, ridx, rel = _data()
    plain, dropped = _model(), _model(entity_dropout=P)
    q = _tail_queries(table, lidx, ridx, rel)
    ref = plain.query_loss(q)
    assert float(dropped.query_loss(q).loss.detach()) == float(
        ref.loss.detach()
    )  # no generator: no dropout

    got = dropped.query_loss(q, torch.Generator().manual_seed(3))
    mask = _mask(q.given.shape, 3)
    assert 0 < int((mask == 0).sum()) < mask.numel()
    want = plain.query_loss(replace(q, given=q.given * mask))
    assert float(got.loss.detach()) == pytest.approx(float(want.loss.detach()), rel=1e-6)
    assert float(got.loss.detach()) != pytest.approx(float(ref.loss.detach()), rel=1e-3)
    assert float(got.reg.detach()) == pytest.approx(float(ref.reg.detach()), rel=1e-6)
    again = dropped.query_loss(q, torch.Generator().manual_seed(3))
    assert float(again.loss.detach()) == float(got.loss.detach())
    other = dropped.query_loss(q, torch.Generator().manual_seed(4))
    assert float(other.loss.detach()) != float(got.loss.detach())


def test_per_edge_dropout_masks_each_side_where_it_is_the_anchor() -> None:
    """Per-edge 1-vs-all (dynamic relations): each side's entity is dropped where it is the
    anchor of the other side's corruption (rhs mask drawn first), never as the true answer or
    a candidate: the loss equals the two all-entity softmaxes over hand-masked anchors."""
    table, lidx, ridx, rel = _data(2)
    model = _model(entity_dropout=P)
    lhs = SideEmbeddings(table[lidx], lidx, None, table)
    rhs = SideEmbeddings(table[ridx], ridx, None, table)
    got = model(lhs, rhs, rel, 0, None, NEGS, need_scores=False, generator=_gen(7))

    gen = _gen(7)
    m_r = torch.empty(rhs.pos.shape).bernoulli_(1 - P, generator=gen) / (1 - P)
    m_l = torch.empty(lhs.pos.shape).bernoulli_(1 - P, generator=gen) / (1 - P)
    with torch.no_grad():
        anchors_r = model.lhs_operator()(lhs.pos * m_l, rel)  # tail queries (h, r, ?)
        anchors_l = model.rhs_operator(0)(rhs.pos * m_r, rel)  # head queries (?, r, t)
        want = (
            all_entity_softmax_loss(anchors_r, table, ridx, None)[0]
            + all_entity_softmax_loss(anchors_l, table, lidx, None)[0]
        )
    assert float(got.loss.detach()) == pytest.approx(float(want), rel=1e-5)
    plain = _model()(lhs, rhs, rel, 0, None, NEGS, need_scores=False)
    assert float(got.reg.detach()) == pytest.approx(float(plain.reg.detach()), rel=1e-6)
    assert float(got.loss.detach()) != pytest.approx(float(plain.loss.detach()), rel=1e-3)


def test_relation_dropout_masks_the_operator_rows_picked_for_each_query() -> None:
    """KvsAll with relation dropout: the anchor of each distinct query is h o (re', im') where
    re' and im' are the relation's parameter rows under inverted-dropout masks drawn from the
    generator (real part first); the N3 term and evaluation (no generator) are unchanged."""
    table, lidx, ridx, rel = _data(5)
    model, plain = _model(relation_dropout=P), _model()
    q = _tail_queries(table, lidx, ridx, rel)
    got = model.query_loss(q, _gen(9))
    gen = _gen(9)
    op = model.lhs_operator()
    with torch.no_grad():
        re, im = op.real[q.query_rel], op.imag[q.query_rel]
        re = re * torch.empty(re.shape).bernoulli_(1 - P, generator=gen) / (1 - P)
        im = im * torch.empty(im.shape).bernoulli_(1 - P, generator=gen) / (1 - P)
        a, b = q.given.chunk(2, dim=1)
        anchors = torch.cat((a * re - b * im, a * im + b * re), dim=1)
        want = all_entity_softmax_loss(anchors, table, ridx, None, rows=q.query_of_edge)[0]
    assert float(got.loss.detach()) == pytest.approx(float(want), rel=1e-5)
    ref = plain.query_loss(q)
    assert float(got.loss.detach()) != pytest.approx(float(ref.loss.detach()), rel=1e-3)
    assert float(got.reg.detach()) == pytest.approx(float(ref.reg.detach()), rel=1e-6)
    assert float(model.query_loss(q).loss.detach()) == float(ref.loss.detach())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _complex_cubes(x: torch.Tensor) -> torch.Tensor:
    """Σ |z|^3 over the complex coordinates [re | im] of the rows of x."""
    re, im = x.chunk(2, dim=-1)
    return torch.complex(re, im).abs().pow(3).sum()


def test_n3_factors_penalises_entity_relation_and_entity_each_on_its_own() -> None:
    """regularizer N3_factors on a tail-query batch: coef x Σ over edges of |h|^3 + |r|^3 +
    |t|^3 (complex moduli, Lacroix et al.); N3 (PBG's): |h o r|^3 in place of |h|^3."""
    table, lidx, ridx, rel = _data(3)
    q = _tail_queries(table, lidx, ridx, rel)
    factors, pbg = _model(regularizer="N3_factors"), _model()
    with torch.no_grad():  # relation moduli well below 1: the two forms differ clearly
        for p in (*factors.parameters(), *pbg.parameters()):
            p.mul_(0.5)
    op = pbg.lhs_operator()
    with torch.no_grad():
        rel_mod = torch.complex(op.real[rel], op.imag[rel]).abs().pow(3).sum()
        common = _complex_cubes(table[ridx]) + rel_mod
        want_factors = 0.01 * (_complex_cubes(table[lidx]) + common)
        want_pbg = 0.01 * (_complex_cubes(op(table[lidx], rel)) + common)
    assert float(factors.query_loss(q).reg.detach()) == pytest.approx(float(want_factors), rel=1e-5)
    assert float(pbg.query_loss(q).reg.detach()) == pytest.approx(float(want_pbg), rel=1e-5)
    assert float(want_factors) != pytest.approx(float(want_pbg), rel=0.1)


def test_training_step_draws_dropout_from_the_trainer_generator() -> None:
    """BatchTrainer steps with entity dropout: the same generator seed gives the same tables;
    they differ from the steps without dropout (the trainer passes its generator)."""
    table, lidx, ridx, rel = _data(4)
    results = []
    for p in (P, P, 0.0):
        spec = perturbed_model("complex_diagonal", entity_dropout=p).spec
        trainer = fresh_trainer(spec)()
        lhs, rhs = fresh_tables(table, table, True)()
        for side in ("rhs", "lhs"):
            trainer.step(Batch(lidx, ridx, rel, 0, None, side), lhs, rhs)
        results.append(lhs.emb)
    assert torch.equal(results[0], results[1])
    assert not torch.allclose(results[0], results[2], atol=1e-6)


def _cfg(**extra: object) -> dict:
    return {
        "entities": {"a": {"num_partitions": 1}},
        "relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "complex_diagonal"}],
        "dynamic_relations": True,
        "global_emb": False,
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "m",
        "dimension": 8,
        **extra,
    }


def test_config_keys_reach_the_model_and_bad_values_fail_in_one_line() -> None:
    cfg = _cfg(entity_dropout=0.3, relation_dropout=0.2, regularizer="n3_factors")
    spec = model_spec(parse_config_dict(cfg), 2)
    assert (spec.entity_dropout, spec.relation_dropout, spec.regularizer) == (
        0.3,
        0.2,
        "N3_factors",
    )
    default = model_spec(parse_config_dict(_cfg()), 2)
    assert (default.entity_dropout, default.relation_dropout, default.regularizer) == (0, 0, "N3")
    for extra, key in (
        ({"entity_dropout": 1.0}, "entity_dropout"),
        ({"entity_dropout": -0.1}, "entity_dropout"),
        ({"entity_dropout": 0.2, "dynamic_relations": False, "global_emb": True}, "entity_dropout"),
        ({"relation_dropout": 1.0}, "relation_dropout"),
        (
            {"relation_dropout": 0.2, "dynamic_relations": False, "global_emb": True},
            "relation_dropout",
        ),
        ({"regularizer": "N2"}, "regularizer"),
    ):
        with pytest.raises(ConfigError, match=key) as info:
            parse_config_dict(_cfg(**extra), "x.yaml")
        assert "\n" not in str(info.value)
