"""The tiled all-entity softmax (1-vs-all, ``all_negs``) against naive references."""

from __future__ import annotations

import pytest
import torch

from bigembed.config import parse_config_dict
from bigembed.errors import ConfigError
from bigembed.model import NegativeSettings, ScoringModel, SideEmbeddings, all_entities
from bigembed.model.all_entities import all_entity_softmax_loss
from bigembed.model.spec import ModelSpec, RelationSpec
from support.steps import fresh_tables, fresh_trainer, perturbed_model


def _naive(a: torch.Tensor, c: torch.Tensor, t: torch.Tensor, w: torch.Tensor | None):
    """The full (B, N) score matrix and torch's cross-entropy over it."""
    scores = a @ c.t()
    per_row = torch.nn.functional.cross_entropy(scores, t, reduction="none")
    return (per_row if w is None else per_row * w).sum(), scores


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_tiled_loss_and_gradients_match_naive(
    monkeypatch: pytest.MonkeyPatch, store: bool, weighted: bool
) -> None:
    """Several tiles (TILE_ROWS = 3 over 10 anchors), with the stored gradient matrix and with
    backward recomputing it tile by tile; a loss scaled by 0.5 downstream scales gradients."""
    monkeypatch.setattr(all_entities, "TILE_ROWS", 3)
    if not store:
        monkeypatch.setattr(all_entities, "STORE_LIMIT_BYTES", 0)
    torch.manual_seed(0)
    a0, c0 = torch.randn(10, 6), torch.randn(13, 6)
    t = torch.randint(13, (10,))
    w = torch.rand(10) if weighted else None
    a, c = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    loss, violators = all_entity_softmax_loss(a, c, t, w)
    (loss * 0.5).backward()
    ra, rc = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    ref, scores = _naive(ra, rc, t, w)
    (ref * 0.5).backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert torch.allclose(a.grad, ra.grad, atol=1e-5) and torch.allclose(c.grad, rc.grad, atol=1e-5)
    pos = scores.detach().gather(1, t.unsqueeze(1))
    assert violators == int((scores.detach() > pos).sum())


def test_bfloat16_products_stay_close() -> None:
    torch.manual_seed(1)
    a0, c0 = torch.randn(20, 16) * 0.3, torch.randn(50, 16) * 0.3
    t = torch.randint(50, (20,))
    a, c = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    loss, _ = all_entity_softmax_loss(a, c, t, None, torch.bfloat16)
    loss.backward()
    ra, rc = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    _naive(ra, rc, t, None)[0].backward()
    assert float(loss.detach()) == pytest.approx(float(_naive(a0, c0, t, None)[0]), rel=1e-2)
    assert torch.allclose(a.grad, ra.grad, atol=3e-2) and torch.allclose(c.grad, rc.grad, atol=3e-2)


def _model(dynamic: bool, comparator: str, operator: str, loss: str = "softmax") -> ScoringModel:
    return perturbed_model(operator, comparator, loss, dynamic, num_dynamic_relations=5)


@pytest.mark.parametrize(
    ("comparator", "dynamic", "operator", "loss"),
    [
        ("dot", True, "complex_diagonal", "softmax"),
        ("cos", False, "diagonal", "softmax"),
        ("dot", False, "linear", "softmax"),
        ("dot", True, "complex_diagonal", "ranking"),  # not a softmax: score blocks both ways
        ("dot", False, "diagonal", "logistic"),
    ],
)
def test_training_path_matches_score_blocks(
    comparator: str, dynamic: bool, operator: str, loss: str
) -> None:
    """need_scores=False (tiled all-entity softmax) and the score-block path (all entities,
    positive masked, generic softmax loss) give the same loss, violators, parameter gradients
    and the same gradient per table row (positive rows and whole-table rows summed, as the
    row-Adagrad update sums them)."""
    model = _model(dynamic, comparator, operator, loss)
    n, rows = 9, 12
    table = torch.randn(rows, 8)
    lidx, ridx = torch.randint(rows, (n,)), torch.randint(rows, (n,))
    rel = torch.randint(5, (n,)) if dynamic else torch.zeros(n, dtype=torch.long)
    weight = torch.rand(n)
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=n)

    def run(need_scores: bool):  # type: ignore[no-untyped-def]
        model.zero_grad()
        leaves = [table[lidx], table.clone(), table[ridx], table.clone()]
        leaves = [x.clone().requires_grad_() for x in leaves]
        lhs = SideEmbeddings(leaves[0], lidx, None, leaves[1])
        rhs = SideEmbeddings(leaves[2], ridx, None, leaves[3])
        out = model(lhs, rhs, rel, 0, weight, negs, need_scores=need_scores)
        (out.loss + out.reg).backward()
        grad = torch.zeros_like(table)
        for idx, leaf in ((lidx, leaves[0]), (ridx, leaves[2])):
            if leaf.grad is not None:
                grad.index_add_(0, idx, leaf.grad)
        for leaf in (leaves[1], leaves[3]):
            if leaf.grad is not None:
                grad += leaf.grad
        return out, grad, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (full, full_grad, full_params), (tiled, tiled_grad, tiled_params) = run(True), run(False)
    if loss == "softmax":
        assert tiled.lhs_neg == [] and tiled.fused_violators is not None
    assert float(tiled.loss.detach()) == pytest.approx(float(full.loss.detach()), rel=1e-5)
    assert torch.allclose(tiled_grad, full_grad, atol=1e-5)
    assert len(full_params) == len(tiled_params)
    for ref, got in zip(full_params, tiled_params, strict=True):
        assert torch.allclose(ref, got, atol=1e-5)
    assert tiled.violators() == full.violators()


def test_query_entity_is_a_negative() -> None:
    """A tail query (h, r, ?) ranks h itself among the candidates: when h scores highest the
    loss is large and the gradient pushes h's candidate row down (its score with the anchor
    falls along the negative gradient)."""
    torch.manual_seed(2)
    c0 = torch.randn(6, 4)
    head, tail = 1, 4
    a0 = c0[head].unsqueeze(0) * 3  # the anchor points at the query entity itself
    a, c = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    loss, violators = all_entity_softmax_loss(a, c, torch.tensor([tail]), None)
    loss.backward()
    assert violators >= 1
    # the step -grad lowers the query entity's score <a, c_head>
    assert float((-c.grad[head]) @ a0[0]) < 0
    # without the query entity among the candidates (tail 4 is then row 3) the loss is lower
    without = all_entity_softmax_loss(a0, c0[[0, 2, 3, 4, 5]], torch.tensor([3]), None)[0]
    assert float(loss.detach()) > float(without)


def _cfg(**extra: object) -> dict:
    return dict(
        entities={"a": {"num_partitions": 1}, "b": {"num_partitions": 1}},
        relations=[{"name": "r", "lhs": "a", "rhs": "b"}, {"name": "s", "lhs": "b", "rhs": "b"}],
        entity_path="e",
        edge_paths=["x"],
        checkpoint_path="c",
        dimension=8,
        **extra,
    )


def test_train_type_1vsall_sets_all_negs_on_every_relation() -> None:
    from bigembed.config import model_spec

    for name in ("1vsAll", "1VSALL"):
        spec = model_spec(parse_config_dict(_cfg(train_type=name)))
        assert all(r.all_negs for r in spec.relations)
    spec = model_spec(parse_config_dict(_cfg()))
    assert not any(r.all_negs for r in spec.relations)


def test_train_type_1vsall_refuses_partitioned_types() -> None:
    data = _cfg(train_type="1vsAll")
    data["entities"]["b"]["num_partitions"] = 4  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"train_type: 1vsAll .* relations\[0\]\.rhs type 'b'"):
        parse_config_dict(data, "x.yaml")


def test_dense_all_rows_update_equals_sparse_row_adagrad() -> None:
    """The dense update of an all-entity batch equals the sparse row-Adagrad over every row
    plus the positives (duplicates summed), state included."""
    from bigembed.kernels.all_rows import all_rows_adagrad_update, whole_table_gradient
    from bigembed.kernels.optimizers import row_adagrad_update

    torch.manual_seed(3)
    table, state = torch.randn(7, 4), torch.rand(7)
    pos_idx = torch.tensor([2, 5, 2])
    side = SideEmbeddings(torch.randn(3, 4), pos_idx, None, torch.randn(7, 4))
    side.pos.grad, side.all.grad = torch.randn(3, 4), torch.randn(7, 4)
    ref_t, ref_s = table.clone(), state.clone()
    updates = [(torch.arange(7), side.all.grad.clone()), (pos_idx, side.pos.grad.clone())]
    row_adagrad_update(ref_t, ref_s, updates, 0.1)
    grad = whole_table_gradient(side)
    assert grad is not None
    all_rows_adagrad_update(table, state, grad, 0.1)
    assert torch.allclose(table, ref_t, atol=1e-6) and torch.allclose(state, ref_s, atol=1e-6)


def test_recipes_load() -> None:
    """Every recipe of examples/ is a valid config; the 1-vs-all ones score all entities."""
    from pathlib import Path

    from bigembed.config import load_config, model_spec

    examples = Path(__file__).resolve().parents[1] / "examples"
    names = ("codexm", "wordnet_like", "social_graph", "user_item", "fb15k237_1vsall")
    for name in (*names, "fb15k237_kvsall", "codexm_kvsall"):
        cfg = load_config(examples / f"{name}.yaml")
        one_vs_all = all(r.all_negs for r in model_spec(cfg, 3).relations)
        assert one_vs_all == (cfg.train_type in ("1vsall", "kvsall")), name
    # the lexical recipe needs the query entity as a negative: sampled, with self_negative on
    from bigembed.buckets import negative_settings

    wordnet = load_config(examples / "wordnet_like.yaml")
    model = ScoringModel(model_spec(wordnet, 11))
    assert all(model.self_negative(negative_settings(wordnet), r) for r in range(11))


@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_reciprocal_eval_scores_head_queries_as_training_does(side: str) -> None:
    """Dynamic relations are the reciprocal model: training scores a head query (?, r, t)
    with op_rhs[r](t) (the tail query of r^-1) and a tail query with op_lhs[r](h); the eval
    direction of the same side gives exactly the training scores against every entity."""
    from bigembed.ranking.directions import direction

    model = _model(True, "dot", "complex_diagonal")
    rows, n = 12, 7
    table = torch.randn(rows, 8)
    lidx, ridx, rel = torch.randint(rows, (n,)), torch.randint(rows, (n,)), torch.randint(5, (n,))
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=n)
    lhs = SideEmbeddings(table[lidx], lidx, None, table)
    rhs = SideEmbeddings(table[ridx], ridx, None, table)
    with torch.no_grad():
        out = model(lhs, rhs, rel, 0, None, negs, need_scores=True)
        d = direction(model, side, -1)
        given = table[ridx] if side == "lhs" else table[lidx]
        scores = d.anchors(given, rel) @ d.candidates(table).t()
    (block,) = out.lhs_neg if side == "lhs" else out.rhs_neg
    true = lidx if side == "lhs" else ridx
    # the training block masks the true entity; every other candidate scores the same
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, true.unsqueeze(1), True)
    assert torch.allclose(block[~mask], scores[~mask], atol=1e-5)
    assert torch.allclose(out.lhs_pos if side == "lhs" else out.rhs_pos, scores[mask], atol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_training_step_updates_every_row_as_sparse_adagrad_would(shared: bool) -> None:
    """BatchTrainer.step with all_negs (one table for both sides, or one per type): the dense
    all-rows update leaves the tables and Adagrad states exactly where the sparse row-Adagrad
    over every row id and the positives would; and repeated steps lower the loss."""
    from bigembed.buckets.batching import Batch
    from bigembed.kernels.optimizers import row_adagrad_update
    from bigembed.kernels.step import BatchTrainer

    rhs_type = "e" if shared else "f"
    spec = ModelSpec(
        relations=(RelationSpec("e", rhs_type, "diagonal", all_negs=True),),
        entity_dims={"e": 6, "f": 6},
        comparator="dot",
        loss="softmax",
        global_emb=False,
    )
    torch.manual_seed(4)
    emb_l = torch.randn(9, 6) * 0.1
    emb_r = emb_l if shared else torch.randn(11, 6) * 0.1
    batch = Batch(
        torch.randint(9, (8,)),
        torch.randint(emb_r.shape[0], (8,)),
        torch.zeros(8, dtype=torch.long),
        0,
        None,
    )

    trainer = fresh_trainer(spec)
    tables = fresh_tables(emb_l, emb_r, shared)

    def sparse(self, lhs, rhs, lhs_side, rhs_side, frozen=(0, 0)) -> None:  # type: ignore[no-untyped-def]
        for table, sides in (
            ((lhs, [lhs_side, rhs_side]),)
            if shared
            else (
                (lhs, [lhs_side]),
                (rhs, [rhs_side]),
            )
        ):
            ups = [(s.pos_idx, s.pos.grad) for s in sides if s.pos.grad is not None]
            ups += [
                (torch.arange(s.all.shape[0]), s.all.grad) for s in sides if s.all.grad is not None
            ]
            row_adagrad_update(table.emb, table.state, ups, self.lr)

    lhs, rhs = tables()
    first = trainer().step(batch, lhs, rhs)
    ref_l, ref_r = tables()
    from unittest import mock

    with mock.patch.object(BatchTrainer, "_update_all_rows", sparse):
        trainer().step(batch, ref_l, ref_r)
    for got, ref in ((lhs, ref_l), (rhs, ref_r)):
        assert torch.allclose(got.emb, ref.emb, atol=1e-6)
        assert torch.allclose(got.state, ref.state, atol=1e-6)
    assert not torch.equal(lhs.emb, emb_l)  # rows moved
    t = trainer()
    losses = [t.step(batch, lhs, rhs).loss for _ in range(30)]
    assert losses[-1] < 0.7 * first.loss
