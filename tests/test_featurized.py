"""Featurized entity types: the bag-mean forward, its backward to the feature rows, a training
step against a dense reference, the features file formats and their bad lines, training on a
planted graph where the features carry the signal, and unseen entities at query time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import bigembed
from bigembed.buckets import Batch, draw_uniform, negative_settings
from bigembed.cli import main
from bigembed.config import model_spec, parse_config_dict
from bigembed.errors import CheckpointError
from bigembed.kernels import BatchTrainer, Table
from bigembed.model import FeatureBags, ScoringModel, SideEmbeddings
from bigembed.serving import UnknownNameError
from bigembed.storage import EntityStore
from support.featurized_graphs import write_featurized_graph

BAGS = [[0, 1], [2], [1, 3, 4], [0, 4]]
WEIGHTS = [[1.0, 3.0], [1.0], [1.0, 1.0, 1.0], [2.0, 2.0]]


def dense(bags: list[list[int]], weights: list[list[float]], num_features: int) -> torch.Tensor:
    """The (entities x features) matrix of the weighted means, computed by hand."""
    m = torch.zeros(len(bags), num_features)
    for e, (bag, ws) in enumerate(zip(bags, weights, strict=True)):
        for f, w in zip(bag, ws, strict=True):
            m[e, f] += w / sum(ws)
    return m


def test_mean_is_the_weighted_mean_of_the_features() -> None:
    feat = torch.randn(5, 3)
    bags = FeatureBags.from_lists(BAGS, WEIGHTS)
    means = bags.mean(feat)
    assert torch.allclose(means[0], 0.25 * feat[0] + 0.75 * feat[1])
    assert torch.allclose(means[2], feat[[1, 3, 4]].mean(0))
    assert torch.allclose(means, dense(BAGS, WEIGHTS, 5) @ feat)
    assert torch.allclose(bags.mean(feat, torch.tensor([3, 0, 3])), means[[3, 0, 3]])
    empty = FeatureBags.from_lists([[1], []])
    assert torch.equal(empty.mean(feat)[1], torch.zeros(3))


def config(**overrides: Any) -> Any:
    data: dict[str, Any] = {
        "entities": {
            "user": {"num_partitions": 1},
            "item": {"num_partitions": 1, "featurized": True},
        },
        "relations": [{"name": "likes", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "m",
        "dimension": 3,
        "comparator": "dot",
        "loss_fn": "ranking",
        "batch_size": 6,
        "num_batch_negs": 3,
        "num_uniform_negs": 2,
    }
    for key, value in overrides.items():
        if key == "all_negs":
            data["relations"][0]["all_negs"] = value
        else:
            data[key] = value
    return parse_config_dict(data)


@pytest.mark.parametrize("mode", ["batch", "uniform", "all_negs", "softmax", "cos_logistic"])
def test_training_step_matches_a_dense_reference(mode: str) -> None:
    """One training step on a featurized table moves the feature rows exactly as row Adagrad
    on the gradient of the same loss written with a dense (entities x features) matrix."""
    overrides: dict[str, Any] = {
        "batch": {"num_uniform_negs": 0},
        "uniform": {},
        "all_negs": {"all_negs": True},
        "softmax": {"loss_fn": "softmax"},
        "cos_logistic": {"comparator": "cos", "loss_fn": "logistic"},
    }[mode]
    cfg = config(**overrides)
    torch.manual_seed(0)
    model = ScoringModel(model_spec(cfg))
    negs = negative_settings(cfg)
    users, feat = torch.randn(4, 3), torch.randn(5, 3)
    bags = FeatureBags.from_lists(BAGS, WEIGHTS)
    lhs, rhs = Table(users.clone(), torch.zeros(4)), Table(feat.clone(), torch.zeros(5), bags)
    batch = Batch(
        torch.tensor([0, 1, 2, 3, 1, 0]),
        torch.tensor([0, 1, 2, 3, 2, 3]),
        torch.zeros(6, dtype=torch.long),
        0,
        None,
    )
    lr = 0.1
    trainer = BatchTrainer(
        model,
        [torch.zeros_like(p) for p in model.parameters()],
        negs,
        lr,
        0.0,
        torch.Generator().manual_seed(3),
    )
    trainer.step(batch, lhs, rhs)

    # The reference: the same negatives, entity rows = M @ features with autograd.
    all_negs = mode == "all_negs"
    gen = torch.Generator().manual_seed(3)
    l_uidx = draw_uniform(4, 6, negs, all_negs, gen)
    r_uidx = draw_uniform(4, 6, negs, all_negs, gen)
    ref_model = ScoringModel(model_spec(cfg))
    ref_model.load_state_dict(model.state_dict())  # relation_lr 0: parameters unchanged
    features = feat.clone().requires_grad_()
    ents = dense(BAGS, WEIGHTS, 5) @ features
    u = users.clone()

    def side(table: torch.Tensor, idx: torch.Tensor, uidx: torch.Tensor | None) -> SideEmbeddings:
        uniform = None if uidx is None else table[uidx].view(-1, negs.num_uniform_negs, 3)
        return SideEmbeddings(table[idx], idx, uniform, table if all_negs else None)

    scores = ref_model(
        side(u, batch.lhs, l_uidx), side(ents, batch.rhs, r_uidx), batch.rel, 0, None, negs
    )
    (scores.loss + scores.reg).backward()
    grad = features.grad
    assert grad is not None and grad.abs().sum() > 0
    state = grad.square().mean(1)
    moved = grad.abs().sum(1) > 0
    expected = feat - lr * grad / (state.sqrt() + 1e-10).unsqueeze(1)
    assert torch.allclose(rhs.emb[moved], expected[moved], atol=1e-5)
    assert torch.allclose(rhs.state, state, atol=1e-6)


# --------------------------------------------------------------------------- import
def run_import(root: Path, features: Path | None, *extra: str) -> int:
    args = ["import", str(root / "config.yaml"), str(root / "edges.tsv"), "--no-progress"]
    args += ["--lhs-col", "0", "--rel-col", "1", "--rhs-col", "2", "--force", *extra]
    if features is not None:
        args += ["--features", f"item={features}"]
    return main(args)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    write_featurized_graph(tmp_path, users=6, items=4, categories=2, edges=40)
    return tmp_path


def bag_of(store: EntityStore, name: str) -> dict[str, float]:
    csr = store.features("item", 0)
    names = store.feature_names("item")
    k = store.name_to_offset("item", 0)[name]
    lo, hi = csr.offsets[k], csr.offsets[k + 1]
    return {
        names[f]: float(w) for f, w in zip(csr.features[lo:hi], csr.weights[lo:hi], strict=True)
    }


def test_import_reads_lists_weighted_rows_and_parquet(small: Path) -> None:
    text = small / "f.tsv"
    text.write_text(
        "# item features\nit0\tred big\nit1\tred\t3\nit1\tsmall\t1\nit2\tred red\n"
        "it3\tbig\nghost\tred\n"
    )
    assert run_import(small, text) == 0
    store = EntityStore(small / "entities")
    assert store.feature_names("item") == ["big", "red", "small"]
    assert bag_of(store, "it0") == {"big": 0.5, "red": 0.5}
    assert bag_of(store, "it1") == {"red": 0.75, "small": 0.25}
    assert bag_of(store, "it2") == {"red": 1.0}  # a repeated feature sums its weights
    pq.write_table(
        pa.table(
            {
                "entity": ["it0", "it1", "it2", "it3"],
                "features": [["a"], ["a", "b"], ["b"], ["c", "a"]],
                "weights": [[1.0], [1.0, 4.0], [2.0], [1.0, 1.0]],
            }
        ),
        small / "f.parquet",
    )
    assert run_import(small, small / "f.parquet") == 0
    store = EntityStore(small / "entities")
    assert bag_of(store, "it1") == pytest.approx({"a": 0.2, "b": 0.8})
    assert store.num_features("item") == 3


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("it0\ta\nit1\ta\tb\tc\n", ":2: expected 'entity<TAB>feat1 feat2 ...'"),
        ("it0\ta\tx\n", ":1: weight 'x' is not a number"),
        ("it0\ta\n\nit1\ta\t-1\n", ":3: weight '-1' must be a positive number"),
        ("it0\t \n", ":1: no features after the tab"),
    ],
)
def test_a_bad_feature_line_is_one_line_naming_file_and_line(
    small: Path, content: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = small / "bad.tsv"
    bad.write_text(content)
    assert run_import(small, bad) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{bad}{why}" in err
    assert not (small / "entities" / "manifest.json").exists()  # nothing published


def test_a_bad_parquet_row_is_named(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = small / "bad.parquet"
    table = {"entity": ["it0", "it1"], "features": [["a"], ["a", "b"]], "weights": [[1.0], [2.0]]}
    pq.write_table(pa.table(table), bad)
    assert run_import(small, bad) != 0
    err = capsys.readouterr().err.strip()
    assert f"{bad}: row 1: weights and features differ in length" in err
    assert len(err.splitlines()) == 1


def test_a_featurized_type_needs_its_features(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_import(small, None) != 0
    err = capsys.readouterr().err.strip()
    assert "entities.item.featurized: true needs its features: pass --features item=FILE" in err
    assert len(err.splitlines()) == 1


# --------------------------------------------------------------------------- train and query
def test_features_carry_the_signal_and_unseen_items_get_embeddings(tmp_path: Path) -> None:
    """Users like items of one category; an item's features are its category and its id.
    Trained on the graph, the model ranks each user's category first, and an item never
    seen in training (known category, unknown id feature) lands among its category."""
    g = write_featurized_graph(
        tmp_path, users=24, items=32, categories=4, edges=900, held_out=4, num_epochs=4
    )
    assert run_import(tmp_path, tmp_path / "features.tsv") == 0
    assert main(["train", str(tmp_path / "config.yaml"), "--no-progress"]) == 0
    model = bigembed.load(tmp_path / "model")
    cat, fav = g["cat"], g["fav"]
    hits = [
        np.mean([cat[int(p.name[2:])] == fav[u] for p in model.predict(f"u{u}", "likes", k=5)])
        for u in range(24)
    ]
    assert np.mean(hits) > 0.9
    for n in range(32, 36):  # held out of the graph entirely
        vector = model.embed([f"c{cat[n]}", f"i{n}"])  # i{n} is unknown: ignored
        near = model.similar(vector, type="item", k=5)
        assert all(cat[int(p.name[2:])] == cat[n] for p in near)
        fans = model.predict_features([f"c{cat[n]}"], "likes", k=3, side="lhs")
        assert all(fav[int(p.name[1:])] == cat[n] for p in fans)
    trained_item = model.vector("it0", type="item")
    assert np.allclose(model.embed([f"c{cat[0]}", "i0"]), trained_item, atol=1e-6)
    ids = {name: f for f, name in enumerate(model.store.feature_names("item"))}
    rows = np.asarray(model.trained.feature_rows("item"))
    rows = rows + model.model.global_embs["item"].detach().numpy()  # global_emb: PBG's default
    weighted = 0.75 * rows[ids["c1"]] + 0.25 * rows[ids["i0"]]
    assert np.allclose(model.embed(["c1", "i0"], weights=[3, 1]), weighted, atol=1e-6)
    both = model.embed([["c1", "i0"], ["c2"]], weights=[[3, 1], [5]])
    assert np.allclose(both, [weighted, rows[ids["c2"]]], atol=1e-6)
    with pytest.raises(UnknownNameError, match="none of the features"):
        model.embed(["nope"])


def test_a_checkpoint_is_refused_when_the_features_were_reimported(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (small / "f.tsv").write_text("it0\ta\nit1\tb\nit2\ta\nit3\tb\n")
    assert run_import(small, small / "f.tsv") == 0
    assert main(["train", str(small / "config.yaml"), "--no-progress", "-p", "num_epochs=1"]) == 0
    assert bigembed.load(small / "model").num_entities("item") == 4
    # remapping (like conversion to PBG) would treat feature rows as entity rows: refused
    assert main(["remap", str(small / "model")]) != 0
    assert "featurized entity types (item) cannot be remapped" in capsys.readouterr().err
    (small / "f.tsv").write_text("it0\ta c\nit1\tb\nit2\ta\nit3\tb\n")
    assert run_import(small, small / "f.tsv") == 0  # same names: the same import id
    with pytest.raises(CheckpointError, match=r"has 3 features but the checkpoint .* with 2"):
        bigembed.load(small / "model")
