"""``bigembed index``: approximate-nearest-neighbour indexes for ``similar`` and ``predict``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import bigembed
from bigembed.checkpoints import start_over
from bigembed.cli import main as cli_main
from bigembed.serving import IndexKnobs, QueryError, ann_build, build_indexes
from bigembed.serving.ann_tune import TuningSample, set_ivf_search, tune_nprobe, without_self
from support.checkpoints import make_config, write_checkpoint, write_graph

faiss = pytest.importorskip("faiss")

RELATIONS = ["r0", "r1"]


def random_model(
    root: Path,
    comparator: str,
    operator: str,
    *,
    n: int = 600,
    dim: int = 8,
    version: int = 1,
    seed: int = 0,
    params: dict[str, torch.Tensor] | None = None,
    rows: np.ndarray | None = None,
):
    """A checkpoint of ``n`` random entities (``rows`` when given) in two partitions, two
    relations with random operator parameters, and a few known edges (for filtering)."""
    rng = np.random.default_rng(seed)
    names = [f"e{i}" for i in range(n)]
    parts = [names[: n // 2], names[n // 2 :]]
    edges = [(names[i], RELATIONS[i % 2], names[(7 * i + 3) % n]) for i in range(n)]
    edges += [(names[0], "r0", names[j]) for j in range(10, 40)]  # many known tails of e0
    write_graph(root, {"node": parts}, RELATIONS, {"train": edges}, dynamic=False)
    cfg = make_config(
        root,
        dimension=dim,
        comparator=comparator,
        entities={"node": {"num_partitions": 2}},
        relations=[
            {"name": r, "lhs": "node", "rhs": "node", "operator": operator} for r in RELATIONS
        ],
    )
    if rows is None:
        rows = rng.standard_normal((n, dim))
    embs = {("node", 0): rows[: n // 2], ("node", 1): rows[n // 2 :]}
    if params is None:
        params = {}
        for i in range(len(RELATIONS)):
            if operator in ("linear", "affine"):
                params[f"rhs_operators.{i}.linear_transformation"] = torch.randn(dim, dim)
            if operator in ("translation", "affine"):
                params[f"rhs_operators.{i}.translation"] = torch.randn(dim)
            if operator == "complex_diagonal":
                params[f"rhs_operators.{i}.real"] = torch.randn(dim // 2)
                params[f"rhs_operators.{i}.imag"] = torch.randn(dim // 2)
    write_checkpoint(cfg, embs, RELATIONS, params=params, version=version)
    return cfg, names


def same(a, b) -> None:
    """Same names in the same order, scores equal up to float rounding."""
    assert [p.name for p in a] == [p.name for p in b]
    np.testing.assert_allclose([p.score for p in a], [p.score for p in b], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("comparator", "operator"),
    [("dot", "linear"), ("dot", "complex_diagonal"), ("cos", "none"), ("l2", "translation")],
)
def test_flat_index_gives_the_exact_results(tmp_path, caplog, comparator, operator) -> None:
    cfg, names = random_model(tmp_path, comparator, operator)
    folder, infos = build_indexes(cfg.checkpoint_path, knobs=IndexKnobs(kind="flat"))
    assert folder == Path(cfg.checkpoint_path) / "index" / "v1"
    assert [i.kind for i in infos] == ["flat"] and infos[0].count == len(names)
    model = bigembed.load(cfg.checkpoint_path)
    queries = names[:6] + names[-6:]
    with caplog.at_level(logging.INFO):
        for side in ("rhs", "lhs"):
            for rel in RELATIONS:
                exact = model.predict(queries, rel, k=8, side=side, exact=True)
                got = model.predict(queries, rel, k=8, side=side)
                for a, b in zip(got, exact, strict=True):
                    same(a, b)
        for a, b in zip(
            model.predict(queries, "r0", k=12, filtered=True),
            model.predict(queries, "r0", k=12, filtered=True, exact=True),
            strict=True,
        ):
            same(a, b)
        metric = infos[0].metric
        for a, b in zip(
            model.similar(queries, k=7, metric=metric),
            model.similar(queries, k=7, metric=metric, exact=True),
            strict=True,
        ):
            same(a, b)
    said = caplog.text
    assert "searching the flat index" in said and "scanning every entity exactly" not in said


def test_filtered_answers_skip_many_known_edges(tmp_path) -> None:
    cfg, _ = random_model(tmp_path, "dot", "none")
    build_indexes(cfg.checkpoint_path, knobs=IndexKnobs(kind="flat"))
    model = bigembed.load(cfg.checkpoint_path)
    known = {f"e{j}" for j in range(10, 40)}
    got = model.predict("e0", "r0", k=5, filtered=True)
    assert len(got) == 5 and not known & {p.name for p in got}
    same(got, model.predict("e0", "r0", k=5, filtered=True, exact=True))


def test_an_index_of_another_version_is_refused(tmp_path) -> None:
    cfg, _ = random_model(tmp_path, "dot", "none")
    build_indexes(cfg.checkpoint_path)
    random_model(tmp_path, "dot", "none", version=2, seed=1)  # training went on
    model = bigembed.load(cfg.checkpoint_path)
    with pytest.raises(QueryError, match="built from checkpoint version 1, not version 2"):
        model.similar("e1", metric="dot")
    with pytest.raises(QueryError, match="version 1"):
        model.predict("e1", "r0")
    same(
        model.similar("e1", metric="dot", exact=True),
        model.similar("e1", metric="dot", exact=True),
    )
    build_indexes(cfg.checkpoint_path)  # rebuilt: served again, the old version's is gone
    assert not (Path(cfg.checkpoint_path) / "index" / "v1").exists()
    fresh = bigembed.load(cfg.checkpoint_path)
    same(fresh.similar("e1", metric="dot"), fresh.similar("e1", metric="dot", exact=True))


def test_a_checkpoint_rewritten_with_the_same_version_is_refused(tmp_path) -> None:
    cfg, _ = random_model(tmp_path, "dot", "none")
    build_indexes(cfg.checkpoint_path)
    random_model(tmp_path, "dot", "none", seed=1)  # another run, version 1 again
    with pytest.raises(QueryError, match="built from another checkpoint of version 1"):
        bigembed.load(cfg.checkpoint_path).similar("e1", metric="dot")


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_kinds_have_high_recall(tmp_path, kind) -> None:
    cfg, _ = random_model(tmp_path, "dot", "none", n=8000, dim=16, params={})
    knobs = IndexKnobs(kind=kind, nlist=64, nprobe=16, pq=8, m=16)
    _, (info,) = build_indexes(cfg.checkpoint_path, knobs=knobs, metric="cos")
    assert info.kind == kind
    model = bigembed.load(cfg.checkpoint_path)
    queries = np.random.default_rng(5).standard_normal((100, 16)).astype(np.float32)
    approx = model.similar(queries, k=10)
    exact = model.similar(queries, k=10, exact=True)
    hits = sum(
        len({p.name for p in a} & {p.name for p in b}) for a, b in zip(approx, exact, strict=True)
    )
    assert hits / 1000 >= 0.9


def test_cli_index_similar_exact_and_fresh(tmp_path, capsys, caplog) -> None:
    cfg, _ = random_model(tmp_path, "cos", "none")
    ckpt = str(cfg.checkpoint_path)
    assert cli_main(["index", ckpt]) == 0
    out = capsys.readouterr().out
    assert "node: flat index of 600 x 8 (cos)" in out and "index/v1" in out
    with caplog.at_level(logging.INFO):
        assert cli_main(["similar", ckpt, "e3", "--json"]) == 0
    used = json.loads(capsys.readouterr().out)
    assert "searching the flat index" in caplog.text
    assert cli_main(["similar", ckpt, "e3", "--json", "--exact"]) == 0
    scanned = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in used] == [r["name"] for r in scanned]
    assert [r["score"] for r in used] == pytest.approx([r["score"] for r in scanned], abs=1e-5)
    random_model(tmp_path, "cos", "none", version=2)
    assert cli_main(["predict", ckpt, "--lhs", "e3", "--rel", "r0"]) != 0
    err = capsys.readouterr().err.strip()
    assert "version 1, not version 2" in err and len(err.splitlines()) == 1
    assert cli_main(["predict", ckpt, "--lhs", "e3", "--rel", "r0", "--exact"]) == 0
    start_over(ckpt)  # train --fresh: the indexes go with the checkpoint
    assert not (Path(ckpt) / "index").exists()


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Rows around 40 centres, like trained embeddings (an IVF index's lists follow them)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim))
    return centres[rng.integers(40, size=n)] + 0.5 * rng.standard_normal((n, dim))


def test_the_kind_and_knobs_follow_the_size() -> None:
    assert IndexKnobs().resolved(100_000, 128) == {"kind": "flat"}
    assert IndexKnobs().resolved(2_000_000, 128)["kind"] == "hnsw"
    big = IndexKnobs().resolved(10_000_000, 128)
    assert big["kind"] == "ivfpq" and big["nlist"] == 3162  # sqrt(rows)
    assert big["nprobe"] is None and big["target_recall"] == 0.95  # tuned at build time
    assert big["train_rows"] == 40 * 3162 and big["pq"] == 32
    given = IndexKnobs(nprobe=20).resolved(10_000_000, 128)
    assert given["nprobe"] == 20 and given["target_recall"] is None and given["tune_queries"] == 0
    assert IndexKnobs(kind="flat").resolved(10_000_000, 128) == {"kind": "flat"}


def test_tune_nprobe_returns_the_smallest_value_reaching_the_target() -> None:
    x = clustered(4000, 16).astype(np.float32)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(16), 16, 64)
    index.train(x)
    index.add(x)
    ids = np.arange(0, 4000, 20)
    sample = TuningSample(ids, x[ids], "l2")
    for first in range(0, 4000, 1000):  # the exact top-k, block by block
        sample.push(first, x[first : first + 1000])

    def recall(nprobe: int) -> float:
        set_ivf_search(index, nprobe)
        return sample.recall(without_self(index.search(x[ids], 21)[1], ids, 20))

    for target in (0.6, 0.9, 0.99, 1.0):
        nprobe, got = tune_nprobe(index, sample, 64, 20, target)
        assert got == recall(nprobe) >= target
        assert nprobe == 1 or recall(nprobe - 1) < target


def test_the_tuned_index_reaches_the_target_recall(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ann_build, "BLOCK_ROWS", 1000)  # several blocks per partition
    n = 12_000
    cfg, names = random_model(
        tmp_path, "cos", "none", n=n, dim=16, params={}, rows=clustered(n, 16)
    )
    knobs = IndexKnobs(kind="ivfpq", pq=8, target_recall=0.9, tune_queries=300)
    _, (info,) = build_indexes(cfg.checkpoint_path, knobs=knobs)
    p = info.params
    assert p["nlist"] == 109 and 1 < p["nprobe"] < p["nlist"]
    assert p["tuned_recall"] >= 0.9 and p["target_recall"] == 0.9
    model = bigembed.load(cfg.checkpoint_path)  # as a user queries: entities, other than tuned
    queries = names[7::60]
    approx = model.similar(queries, k=10)
    exact = model.similar(queries, k=10, exact=True)
    hits = sum(
        len({x.name for x in a} & {x.name for x in b}) for a, b in zip(approx, exact, strict=True)
    )
    assert hits / (10 * len(queries)) >= 0.85


def test_cli_refuses_a_bad_target_recall(tmp_path, capsys) -> None:
    cfg, _ = random_model(tmp_path, "cos", "none")
    assert cli_main(["index", str(cfg.checkpoint_path), "--target-recall", "1.5"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--target-recall 1.5" in err and len(err.splitlines()) == 1
