"""``train_type: KvsAll``: the 1-vs-all loss computed once per distinct query of a batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.buckets.batching import PLAN_SIDES, batch_plan, make_batches
from bigembed.config import model_spec, parse_config_dict
from bigembed.errors import ConfigError
from bigembed.model import NegativeSettings, QueryBatch, ScoringModel, SideEmbeddings, all_entities
from bigembed.model.all_entities import all_entity_softmax_loss
from bigembed.model.spec import ModelSpec, RelationSpec
from support.graphs import graph_config, write_graph
from support.steps import fresh_tables, fresh_trainer, perturbed_model


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_several_pairs_per_anchor_equal_one_copy_of_the_anchor_per_pair(
    monkeypatch: pytest.MonkeyPatch, store: bool, weighted: bool
) -> None:
    """Pairs (anchor row, target) in any order, several per anchor (TILE_ROWS = 3 over 7
    anchors, tiles with 0..n pairs): loss, violators and gradients equal the per-pair
    cross-entropy of a copy of the anchor per pair."""
    monkeypatch.setattr(all_entities, "TILE_ROWS", 3)
    if not store:
        monkeypatch.setattr(all_entities, "STORE_LIMIT_BYTES", 0)
    torch.manual_seed(0)
    a0, c0 = torch.randn(7, 6), torch.randn(13, 6)
    rows = torch.tensor([4, 0, 0, 6, 0, 4, 2, 3, 3, 3, 6, 0])  # row 1 and 5: no pair
    targets = torch.randint(13, (12,))
    targets[1] = targets[2]  # a duplicate pair
    w = torch.rand(12) if weighted else None
    a, c = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    loss, violators = all_entity_softmax_loss(a, c, targets, w, rows=rows)
    (loss * 0.5).backward()
    ra, rc = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    scores = ra[rows] @ rc.t()
    per_pair = torch.nn.functional.cross_entropy(scores, targets, reduction="none")
    ref = (per_pair if w is None else per_pair * w).sum()
    (ref * 0.5).backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert torch.allclose(a.grad, ra.grad, atol=1e-5)
    assert torch.allclose(c.grad, rc.grad, atol=1e-5)
    pos = scores.detach().gather(1, targets.unsqueeze(1))
    assert violators == int((scores.detach() > pos).sum())


def _model(comparator: str = "dot", regularizer: str = "N3") -> ScoringModel:
    return perturbed_model("complex_diagonal", comparator, regularizer=regularizer)


def _queries(side: str, table: torch.Tensor, lidx, ridx, rel, weight) -> QueryBatch:  # type: ignore[no-untyped-def]
    """The QueryBatch the training step builds (BatchTrainer._query_step)."""
    given, target = (lidx, ridx) if side == "rhs" else (ridx, lidx)
    keys, inverse = torch.unique(given * 3 + rel, return_inverse=True)
    leaves = [table[keys // 3], table.clone(), table[target]]
    leaves = [x.clone().requires_grad_() for x in leaves]
    return QueryBatch(side, leaves[0], keys % 3, leaves[1], leaves[2], target, inverse, rel, weight)


@pytest.mark.parametrize(
    ("comparator", "regularizer"), [("dot", "N3"), ("cos", "N3"), ("dot", "N3_factors")]
)
def test_tail_and_head_query_batches_sum_to_the_per_edge_1vsall_step(
    comparator: str, regularizer: str
) -> None:
    """The grouped tail-query batch plus the grouped head-query batch of some edges (queries
    repeated: 30 edges over 4 entities x 3 relations) give the loss, N3 term (either form),
    per-row table gradient and relation-parameter gradients of the per-edge 1-vs-all batch of
    both sides."""
    model = _model(comparator, regularizer)
    rows, n = 4, 30
    torch.manual_seed(1)
    table = torch.randn(rows, 8)
    lidx, ridx, rel = torch.randint(rows, (n,)), torch.randint(rows, (n,)), torch.randint(3, (n,))
    weight = torch.rand(n)
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=n)

    model.zero_grad()
    leaves = [x.clone().requires_grad_() for x in (table[lidx], table, table[ridx], table)]
    lhs = SideEmbeddings(leaves[0], lidx, None, leaves[1])
    rhs = SideEmbeddings(leaves[2], ridx, None, leaves[3])
    ref = model(lhs, rhs, rel, 0, weight, negs, need_scores=False)
    (ref.loss + ref.reg).backward()
    ref_grad = torch.zeros_like(table)
    for idx, leaf in ((lidx, leaves[0]), (None, leaves[1]), (ridx, leaves[2]), (None, leaves[3])):
        assert leaf.grad is not None
        ref_grad += (
            leaf.grad if idx is None else torch.zeros_like(table).index_add_(0, idx, leaf.grad)
        )
    ref_params = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    got_grad = torch.zeros_like(table)
    loss = reg = 0.0
    violators = [0, 0]
    for side in ("rhs", "lhs"):
        q = _queries(side, table, lidx, ridx, rel, weight)
        assert q.given.shape[0] < n, "queries are shared"
        out = model.query_loss(q)
        (out.loss + out.reg).backward()
        loss, reg = loss + float(out.loss.detach()), reg + float(out.reg.detach())
        violators = [v + o for v, o in zip(violators, out.violators(), strict=True)]
        assert q.given.grad is not None and q.targets.grad is not None and q.whole.grad is not None
        given_rows = torch.unique((lidx if side == "rhs" else ridx) * 3 + rel) // 3
        got_grad.index_add_(0, given_rows, q.given.grad)
        got_grad.index_add_(0, q.target_idx, q.targets.grad)
        got_grad += q.whole.grad
    assert loss == pytest.approx(float(ref.loss.detach()), rel=1e-5)
    assert reg == pytest.approx(float(ref.reg.detach()), rel=1e-5)
    assert torch.allclose(got_grad, ref_grad, atol=1e-5)
    for want, p in zip(ref_params, model.parameters(), strict=True):
        assert p.grad is not None and torch.allclose(p.grad, want, atol=1e-5)
    assert tuple(violators) == ref.violators()


def test_query_plan_trains_every_edge_once_per_side_query_by_query() -> None:
    """Every edge appears once among the tail-query batches and once among the head-query
    batches; every batch trains one side; within a side the edges of a query are contiguous."""
    rng = np.random.default_rng(0)
    n = 2345
    lhs = torch.from_numpy(rng.integers(0, 40, n))
    rhs = torch.from_numpy(rng.integers(0, 40, n))
    rel = torch.from_numpy(rng.integers(0, 5, n))
    order, plan = batch_plan(rel, 100, True, np.random.default_rng(1), (lhs, rhs))
    assert order is not None and len(order) == 2 * n
    seen: dict[str, list[torch.Tensor]] = {"lhs": [], "rhs": []}
    for begin, end, _ridx, code in plan:
        side = PLAN_SIDES[int(code)]
        assert 0 < end - begin <= 100 and side in seen
        assert (begin < n) == (side == "rhs"), "a batch never mixes the sides"
        seen[side].append(order[begin:end])
    for side, given in (("rhs", lhs), ("lhs", rhs)):
        edges = torch.cat(seen[side]) if side == "rhs" else order[n:]
        assert sorted(torch.cat(seen[side]).tolist()) == list(range(n))
        keys = (given * 5 + rel)[order[:n] if side == "rhs" else order[n:]].tolist()
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(keys)), "one contiguous run per query"
        assert len(edges) == n
    assert {int(c) for c in plan[:, 3]} == {1, 2}
    assert not (np.diff(plan[:, 0]) > 0).all(), "the two sides' batches are interleaved"
    walked = list(make_batches(lhs, rhs, rel, None, 100, True, np.random.default_rng(1), True))
    assert [b.side for b in walked] == [PLAN_SIDES[int(c)] for c in plan[:, 3]]
    assert sum(len(b) for b in walked) == 2 * n


def _cfg(**extra: object) -> dict:
    return {
        "entities": {"a": {"num_partitions": 1}},
        "relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "complex_diagonal"}],
        "dynamic_relations": True,
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "m",
        "dimension": 8,
        "loss_fn": "softmax",
        "train_type": "KvsAll",
        "global_emb": False,
        **extra,
    }


def test_kvsall_config() -> None:
    """KvsAll scores every entity (all_negs) and refuses what its grouped path cannot do, in
    one line naming the key."""
    assert all(r.all_negs for r in model_spec(parse_config_dict(_cfg()), 3).relations)
    for key, value in (("dynamic_relations", False), ("loss_fn", "ranking"), ("comparator", "l2")):
        with pytest.raises(ConfigError, match=rf"{key}: train_type: KvsAll needs") as info:
            parse_config_dict(_cfg(**{key: value}), "x.yaml")
        assert "\n" not in str(info.value)
    data = _cfg()
    data["entities"]["a"]["num_partitions"] = 2  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"train_type: KvsAll scores every entity"):
        parse_config_dict(data, "x.yaml")


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.integration)])
def test_kvsall_training_learns_and_counts_every_edge_once(tmp_path: Path, workers: int) -> None:
    """End to end (one worker; two Hogwild workers taking planned batches): the loss per edge
    falls over epochs and each epoch reports every training edge once."""
    from bigembed.checkpoints.store import CheckpointStore
    from bigembed.train.single_machine import train

    write_graph(tmp_path, num_entities=60, num_edges=1500)
    cfg = graph_config(
        tmp_path,
        train_type="KvsAll",
        num_epochs=4,
        workers=workers,
        batch_size=200,
        regularization_coef=1e-3,
    )
    train(cfg, progress=False)
    steps = [r for r in CheckpointStore(cfg.checkpoint_path).read_stats() if r["type"] == "step"]
    assert len(steps) == 4
    assert all(s["stats"]["count"] == 1500 for s in steps)
    losses = [s["stats"]["loss"] for s in steps]
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("shared", [True, False])
def test_query_step_updates_rows_as_sparse_row_adagrad_would(shared: bool) -> None:
    """BatchTrainer.step on a tail-query and a head-query batch (one table for both sides, or
    one per type): the dense update leaves the tables and Adagrad states where the sparse
    row-Adagrad of the query loss's gradients (query rows, target rows, every candidate row,
    duplicates summed) would; the relation parameters move."""
    from bigembed.buckets.batching import Batch
    from bigembed.kernels.optimizers import row_adagrad_update

    rhs_type = "e" if shared else "f"
    spec = ModelSpec(
        relations=(RelationSpec("e", rhs_type, "complex_diagonal", all_negs=True),),
        entity_dims={"e": 6, "f": 6},
        comparator="dot",
        loss="softmax",
        regularization_coef=0.01,
        global_emb=False,
        dynamic_relations=True,
        num_dynamic_relations=3,
    )
    torch.manual_seed(4)
    emb_l = torch.randn(5, 6) * 0.3
    emb_r = emb_l if shared else torch.randn(7, 6) * 0.3
    n = 20
    lidx, ridx = torch.randint(5, (n,)), torch.randint(emb_r.shape[0], (n,))
    rel = torch.randint(3, (n,))

    trainer = fresh_trainer(spec)
    tables = fresh_tables(emb_l, emb_r, shared)

    for side in ("rhs", "lhs"):
        lhs, rhs = tables()
        t = trainer()
        params = [p.detach().clone() for p in t.model.parameters()]
        stats = t.step(Batch(lidx, ridx, rel, 0, None, side), lhs, rhs)
        assert stats.count == (n if side == "rhs" else 0)
        assert any(not torch.equal(a, b) for a, b in zip(params, t.model.parameters(), strict=True))
        # the reference: the same gradients, applied by the sparse row-Adagrad
        ref_l, ref_r = tables()
        model = trainer().model
        given_tab, target_tab = (ref_l, ref_r) if side == "rhs" else (ref_r, ref_l)
        given, target = (lidx, ridx) if side == "rhs" else (ridx, lidx)
        keys, inverse = torch.unique(given * 3 + rel, return_inverse=True)
        leaves = [given_tab.emb[keys // 3], target_tab.emb.clone(), target_tab.emb[target]]
        leaves = [x.clone().requires_grad_() for x in leaves]
        q = QueryBatch(side, leaves[0], keys % 3, leaves[1], leaves[2], target, inverse, rel, None)
        out = model.query_loss(q)
        (out.loss + out.reg).backward()
        ups_given = [(keys // 3, q.given.grad)]
        ups_target = [
            (torch.arange(target_tab.emb.shape[0]), q.whole.grad),
            (target, q.targets.grad),
        ]
        if shared:
            row_adagrad_update(ref_l.emb, ref_l.state, ups_given + ups_target, 0.1)
        else:
            row_adagrad_update(given_tab.emb, given_tab.state, ups_given, 0.1)
            row_adagrad_update(target_tab.emb, target_tab.state, ups_target, 0.1)
        for got, ref in ((lhs, ref_l), (rhs, ref_r)):
            assert torch.allclose(got.emb, ref.emb, atol=1e-6)
            assert torch.allclose(got.state, ref.state, atol=1e-6)
        assert not torch.equal(lhs.emb, emb_l) or not torch.equal(rhs.emb, emb_r)
