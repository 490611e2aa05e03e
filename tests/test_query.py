"""The Python query API (``bigembed.load``) and ``bigembed predict`` / ``bigembed similar``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bigembed
from bigembed.cli import main as cli_main
from bigembed.errors import BigembedError, InputError
from bigembed.serving import QueryError, UnknownNameError, example_predictions
from support.checkpoints import TrainedRing, make_config, write_checkpoint, write_graph


@pytest.fixture(scope="module")
def ring(trained_checkpoint: TrainedRing):
    cfg = trained_checkpoint.config
    return cfg, trained_checkpoint.edges, bigembed.load(cfg.checkpoint_path)


def test_predicts_memorised_edges_on_both_sides(ring) -> None:
    _, edges, model = ring
    for h, r, t in edges:
        assert model.predict(h, r, k=1)[0].name == t
        assert model.predict(t, r, k=1, side="lhs")[0].name == h
    batch = model.predict([e[0] for e in edges], [e[1] for e in edges], k=2)
    assert [b[0].name for b in batch] == [e[2] for e in edges]


def test_filtered_predictions_leave_out_known_edges(ring) -> None:
    cfg, edges, model = ring
    h, r, _ = edges[0]
    known = {tail for hh, rr, tail in edges if (hh, rr) == (h, r)}
    preds = model.predict(h, r, k=5, filtered=True)
    assert len(preds) == 5 and not known & {p.name for p in preds}
    raw = model.predict(h, r, k=6)
    assert [p.name for p in raw if p.name not in known][:5] == [p.name for p in preds]
    explicit = model.predict(h, r, k=5, filtered=[cfg.edge_paths[0]])
    assert explicit == preds


def test_scores_match_predictions_and_directions(ring) -> None:
    _, edges, model = ring
    h, r, t = edges[3]
    top = model.predict(h, r, k=3)
    got = model.score(h, r, [p.name for p in top], side="rhs")
    np.testing.assert_allclose(got, [p.score for p in top], rtol=1e-5)
    heads = model.predict(t, r, k=2, side="lhs")
    np.testing.assert_allclose(
        model.score([p.name for p in heads], r, t, side="lhs"), [p.score for p in heads], rtol=1e-5
    )
    both = model.score(h, r, t)
    assert both == pytest.approx(
        (model.score(h, r, t, side="lhs") + model.score(h, r, t, side="rhs")) / 2
    )


def test_similar_leaves_itself_out_unless_asked(ring) -> None:
    _, _, model = ring
    for metric in ("cos", "l2", "dot"):
        res = model.similar("n3", k=4, metric=metric)
        assert "n3" not in [p.name for p in res] and len(res) == 4
        assert [p.score for p in res] == sorted((p.score for p in res), reverse=True)
        with_self = model.similar("n3", k=5, metric=metric, include_self=True)
        assert [p.name for p in with_self if p.name != "n3"] == [p.name for p in res]
    for metric in ("cos", "l2"):
        res = model.similar("n3", k=4, metric=metric, include_self=True)
        assert res[0].name == "n3" and len(res) == 4
    assert model.similar("n3", k=1, include_self=True)[0].score == pytest.approx(1.0, abs=1e-5)
    assert model.similar("n3", k=1, metric="l2", include_self=True)[0].score == 0.0
    assert len(model.similar("n3", k=100)) == 11  # every other entity of the type
    # FAISS only when installed and asked; with or without it, the same exact answer
    with_faiss, without = model.similar("n3", k=3, use_faiss=True), model.similar("n3", k=3)
    assert [p.name for p in with_faiss] == [p.name for p in without]
    assert [p.score for p in with_faiss] == pytest.approx([p.score for p in without], abs=1e-6)


def test_names_vectors_and_errors(ring) -> None:
    _, _, model = ring
    assert model.entity_names() == [f"n{i}" for i in range(12)]
    assert model.relation_names == ["far", "next"]
    assert model.vector("n1").shape == (16,)
    np.testing.assert_array_equal(model.vectors(["n1", "n2"])[1], model.vector("n2"))
    with pytest.raises(KeyError, match="unknown entity 'nobody'"):
        model.predict("nobody", "next")
    with pytest.raises(UnknownNameError, match="unknown relation 'nope'"):
        model.score("n1", "nope", "n2")
    with pytest.raises(InputError):
        model.entity_names("no_such_type")


def test_example_predictions_show_names_and_ranks(ring) -> None:
    cfg, _, model = ring
    text = example_predictions(model, n=3, edge_path=Path(cfg.edge_paths[0]).parent / "test")
    assert text.count("-->") == 3 and "rank 1 of 12" in text and " *" in text


def test_search_spans_partitions(tmp_path: Path) -> None:
    """The same embeddings in 1 or 3 partitions give the same predictions and neighbours."""
    rng = np.random.default_rng(0)
    names = [f"e{i}" for i in range(10)]
    emb = rng.normal(size=(10, 4)).astype(np.float32)
    results = []
    for parts in (1, 3):
        root = tmp_path / str(parts)
        members = [list(range(p, 10, parts)) for p in range(parts)]
        write_graph(
            root,
            {"node": [[names[i] for i in m] for m in members]},
            ["all"],
            {"train": [("e0", "all", "e1")]},
            dynamic=False,
        )
        cfg = make_config(
            root,
            dimension=4,
            entities={"node": {"num_partitions": parts}},
            relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
        )
        write_checkpoint(
            cfg,
            {("node", p): emb[m] for p, m in enumerate(members)},
            ["all"],
            params={"rhs_operators.0.diagonal": torch.tensor([1.0, -1, 2, 0.5])},
        )
        model = bigembed.load(cfg.checkpoint_path)
        results.append(
            (
                model.predict("e4", "all", k=10),
                model.similar("e2", k=10),
                model.predict("e4", "all", k=10, filtered=True),
            )
        )
    for a, b in zip(*results, strict=True):
        assert [p.name for p in a] == [p.name for p in b]
        np.testing.assert_allclose([p.score for p in a], [p.score for p in b], rtol=1e-6)


def test_cli_predict_and_similar(ring, capsys) -> None:
    cfg, edges, _ = ring
    h, r, t = edges[0]
    assert cli_main(["predict", cfg.checkpoint_path, "--lhs", h, "--rel", r, "-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[:2] == ["1", t]
    assert cli_main(["predict", cfg.checkpoint_path, "--rhs", t, "--rel", r, "--json"]) == 0
    assert f'"name": "{h}"' in capsys.readouterr().out
    assert cli_main(["similar", cfg.checkpoint_path, "n5", "-k", "3"]) == 0
    listed = [line.split()[1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert len(listed) == 3 and "n5" not in listed
    assert cli_main(["similar", cfg.checkpoint_path, "n5", "-k", "3", "--include-self"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:2] == ["1", "n5"]
    assert cli_main(["predict", cfg.checkpoint_path, "--lhs", "zz", "--rel", r]) == 2
    assert "unknown entity 'zz'" in capsys.readouterr().err


@pytest.mark.integration
def test_import_bigembed_stays_cheap() -> None:
    code = "import sys, bigembed; print('torch' in sys.modules); print(callable(bigembed.load))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.integration
def test_the_launcher_does_not_import_torch() -> None:
    """Importing ``bigembed launch``'s module stays cheap (no torch): torch, for its elastic
    agent, is imported only when a launch runs, after the config is checked."""
    code = (
        "import sys; from bigembed.commands.launch_ranks import launch, resolve; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


@pytest.mark.parametrize("k", [0, -1, 2.5, True, "3", None])
def test_k_must_be_a_positive_integer(ring, k) -> None:
    _, edges, model = ring
    h, r, _ = edges[0]
    for call in (lambda: model.predict(h, r, k=k), lambda: model.similar(h, k=k)):
        with pytest.raises(QueryError, match="k must be a positive integer") as info:
            call()
        assert isinstance(info.value, BigembedError) and isinstance(info.value, ValueError)
    assert len(model.predict(h, r, k=np.int64(2))) == 2  # numpy integers are integers


@pytest.mark.parametrize("k", ["0", "-3"])
def test_cli_k_is_checked_once_by_the_api(ring, capsys, k: str) -> None:
    cfg, edges, _ = ring
    h, r, _ = edges[0]
    for argv in (
        ["predict", cfg.checkpoint_path, "--lhs", h, "--rel", r, "-k", k],
        ["similar", cfg.checkpoint_path, h, "-k", k],
    ):
        assert cli_main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # no partial output
        err = captured.err.strip().splitlines()
        assert err == [f"bigembed {argv[0]}: error: k must be a positive integer, got {int(k)}"]


@pytest.mark.parametrize("name", [0, 3.5, None, b"n1"])
def test_entity_names_must_be_strings(ring, name) -> None:
    _, edges, model = ring
    _, r, t = edges[0]
    calls = [
        lambda: model.similar(name),
        lambda: model.predict(name, r),
        lambda: model.score(name, r, t),
        lambda: model.vector(name),
    ]
    for call in calls:
        with pytest.raises(QueryError, match="entity names are strings"):
            call()


def test_relations_are_names_or_ids(ring) -> None:
    _, edges, model = ring
    h, r, t = edges[0]
    rid = model.relation_names.index(r)
    assert model.predict(h, rid, k=3) == model.predict(h, r, k=3)
    np.testing.assert_array_equal(model.score(h, np.int64(rid), t), model.score(h, r, t))
    for bad in (True, 1.0, None):
        with pytest.raises(QueryError, match="a relation is a name"):
            model.predict(h, bad)
    with pytest.raises(UnknownNameError, match="out of range"):
        model.predict(h, len(model.relation_names))


def test_similar_takes_a_list_of_names(ring, capsys) -> None:
    cfg, _, model = ring
    names = ["n3", "n7", "n3"]
    for include_self in (False, True):
        each = [model.similar(n, k=4, include_self=include_self) for n in names]
        for query in (names, tuple(names), np.array(names)):
            _same(model.similar(query, k=4, include_self=include_self), each)
    assert model.similar([], k=2) == []
    assert cli_main(["similar", cfg.checkpoint_path, "n3", "n7", "-k", "2"]) == 0
    blocks = capsys.readouterr().out.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["Nearest to n3 (cos):", "Nearest to n7 (cos):"]
    for block, name in zip(blocks, ["n3", "n7"], strict=True):
        listed = [line.split()[1] for line in block.strip().splitlines()[2:]]
        assert listed == [p.name for p in model.similar(name, k=2)]
    argv = ["similar", cfg.checkpoint_path, "-k", "2", "--json", "n3", "n7"]  # names after options
    assert cli_main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert [g["query"] for g in got] == ["n3", "n7"]
    assert [r["name"] for r in got[1]["results"]] == [p.name for p in model.similar("n7", k=2)]


def test_similar_takes_a_vector(ring, capsys, tmp_path) -> None:
    cfg, _, model = ring
    for metric in ("cos", "dot", "l2"):
        by_name = model.similar("n5", k=4, metric=metric, include_self=True)
        for vector in (model.vector("n5"), torch.from_numpy(model.vector("n5"))):
            assert _names(model.similar(vector, k=4, metric=metric)) == _names(by_name)
    rows = model.vectors(["n1", "n2"])
    both = model.similar(rows, k=3)
    assert [_names(b) for b in both] == [
        _names(model.similar(n, k=3, include_self=True)) for n in ("n1", "n2")
    ]
    mean = model.similar(rows.mean(0), k=2)
    assert len(mean) == 2 and mean[0].type == "node"
    np.save(tmp_path / "v.npy", model.vector("n5"))
    text = ",".join(repr(float(x)) for x in model.vector("n5"))
    for arg in (str(tmp_path / "v.npy"), text):  # after --: the first number may be negative
        argv = ["similar", cfg.checkpoint_path, "--vector", "-k", "3", "--json", "--", arg]
        assert cli_main(argv) == 0
        got = [r["name"] for r in json.loads(capsys.readouterr().out)]
        assert got == _names(model.similar("n5", k=3, include_self=True))
    np.save(tmp_path / "m.npy", rows)
    argv = ["similar", cfg.checkpoint_path, "--vector", str(tmp_path / "m.npy"), "-k", "2"]
    assert cli_main(argv) == 0
    titles = [line for line in capsys.readouterr().out.splitlines() if "Nearest" in line]
    assert titles == ["Nearest to m.npy row 1 (cos):", "Nearest to m.npy row 2 (cos):"]
    with pytest.raises(QueryError, match="have 3 values but 'node' embeddings have 16"):
        model.similar(np.ones(3))
    with pytest.raises(QueryError, match="NaN"):
        model.similar(np.full(16, np.nan))
    for argv in (
        ["similar", cfg.checkpoint_path, "--vector", "1,x"],
        ["similar", cfg.checkpoint_path, "--vector", "n1"],
        ["similar", cfg.checkpoint_path, "--vector", str(tmp_path / "missing.npy")],
        ["similar", cfg.checkpoint_path, "--vector", "1,2,3"],
        ["similar", cfg.checkpoint_path, "--vector", "1,2", "1,2,3"],
    ):
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bigembed similar: error: "), err


def test_messages_about_many_names_stay_short(ring) -> None:
    _, edges, model = ring
    _, r, _ = edges[0]
    many = [f"someone_{i:04d}" for i in range(1000)]
    calls = [
        (lambda: model.similar(many), "unknown entities 'someone_0000', 'someone_0001', "),
        (lambda: model.predict(many, r), "unknown entities 'someone_0000', "),
        (lambda: model.vectors(many), "unknown entities 'someone_0000', "),
        (lambda: model.vector(many), "entity names are strings, got a list of 1,000 ("),
        (lambda: model.similar([*["n1"] * 999, 5]), "entity names are strings, got 5 (int)"),
    ]
    for call, start in calls:
        with pytest.raises(BigembedError) as info:
            call()
        message = str(info.value)
        assert start in message and len(message) < 200, message
    assert "and 997 more" in _message(lambda: model.similar(many))


def _same(got: list, want: list) -> None:
    """The same answers, scores up to float rounding (a batch sums in another order)."""
    assert [_names(g) for g in got] == [_names(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert [p.score for p in g] == pytest.approx([p.score for p in w], rel=1e-5, abs=1e-6)


def _names(predictions) -> list[str]:
    return [p.name for p in predictions]


def _message(call) -> str:
    with pytest.raises(BigembedError) as info:
        call()
    return str(info.value)
