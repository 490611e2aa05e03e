"""Full ranking: hand-computed ranks, raw vs filtered, partitions, chunking, both modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.checkpoints.reading import load_trained
from bigembed.checkpoints.tables import EntityTables
from bigembed.ranking.filters import KnownEdges
from bigembed.ranking.full import EvalEdges, rank_edges
from support.checkpoints import USER_ITEM_RELATIONS, make_config, user_item_config, write_checkpoint


def _rank(cfg, edges: EvalEdges, known: KnownEdges | None, **kw):
    trained = load_trained(cfg.checkpoint_path)
    return rank_edges(
        trained.model, EntityTables(trained), trained.partition_bases, edges, known, **kw
    )


def test_raw_and_filtered_ranks_on_hand_built_scores(tmp_path: Path) -> None:
    # dot scores along one axis: e0=1, e1=5, e2=4, e3=3, e4=3, e5=1
    cfg = make_config(tmp_path)
    emb = np.array([[1, 0], [5, 0], [4, 0], [3, 0], [3, 0], [1, 0]], np.float32)
    write_checkpoint(cfg, {("node", 0): emb}, ["all"])
    test = EvalEdges([0], [0], [3])  # (e0, r, e3): score 3
    # known: the test edge itself, (e0, r, e1) and (e2, r, e3)
    known = KnownEdges(np.array([0, 0, 2]), np.array([0, 0, 0]), np.array([3, 1, 3]), 1)
    res = _rank(cfg, test, known)
    # tails of (e0, r, ?): e1=5, e2=4 above, e4=3 ties -> raw rank 4; e1 is known -> 3
    assert res.rhs.raw.tolist() == [4] and res.rhs.filtered.tolist() == [3]
    assert res.rhs.candidates.tolist() == [6] and res.rhs.removed.tolist() == [1]
    assert res.rhs.auc(False).tolist() == pytest.approx([2 / 5])  # e0 and e5 below
    # heads of (?, r, e3) against [3, 0]: e1=15, e2=12, e3=9, e4=9 above, e5=3 ties e0=3
    assert res.lhs.raw.tolist() == [6] and res.lhs.filtered.tolist() == [5]  # e2 known
    # the positive itself is never filtered out, even though it is a known edge
    assert res.lhs.removed.tolist() == [1]


def _grid(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Values on a 0.5 grid: every score below is exact in float32, so ties are exact too."""
    return (rng.integers(-2, 3, shape) * 0.5).astype(np.float32)


def _cx(v: np.ndarray, re: np.ndarray, im: np.ndarray) -> np.ndarray:
    a, b = np.split(v, 2, axis=-1)
    return np.concatenate([a * re - b * im, a * im + b * re], axis=-1)


def _reference(scores_of, edges: EvalEdges, known_pairs: set[tuple[int, int, int]] | None):
    """Brute force: scores_of(side, i) -> all candidate scores of edge i; returns ranks."""
    out = {}
    for side in ("lhs", "rhs"):
        raw, filt = [], []
        for i in range(len(edges)):
            s = scores_of(side, i)
            true = edges.lhs[i] if side == "lhs" else edges.rhs[i]
            others = np.arange(len(s)) != true
            raw.append(1 + int(np.sum((s >= s[true]) & others)))
            if known_pairs is not None:

                def is_known(c, i=i, side=side):
                    e = (
                        (c, edges.rel[i], edges.rhs[i])
                        if side == "lhs"
                        else (edges.lhs[i], edges.rel[i], c)
                    )
                    return e in known_pairs

                keep = np.array([not is_known(c) for c in range(len(s))]) & others
                filt.append(1 + int(np.sum((s >= s[true]) & keep)))
        out[side] = (raw, filt)
    return out


def _layouts(n: int, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Entities of each partition (as ids of the single-partition layout)."""
    perm = rng.permutation(n)
    return [np.sort(perm[p::parts]) for p in range(parts)]


@pytest.mark.parametrize("parts", [1, 3])
def test_dynamic_complex_matches_brute_force(tmp_path: Path, parts: int) -> None:
    rng = np.random.default_rng(0)
    n, dim, nrel = 30, 4, 3
    emb = _grid(rng, n, dim)
    params = {
        f"{s}_operators.0.{p}": torch.from_numpy(_grid(rng, nrel, dim // 2))
        for s in ("lhs", "rhs")
        for p in ("real", "imag")
    }
    edges = EvalEdges(rng.integers(0, n, 40), rng.integers(0, nrel, 40), rng.integers(0, n, 40))
    edges.lhs[:10], edges.rel[:10] = 3, 1  # shared anchors with different tails
    known = EvalEdges(rng.integers(0, n, 200), rng.integers(0, nrel, 200), rng.integers(0, n, 200))
    known = EvalEdges.concat([known, edges])
    pairs = set(zip(known.lhs.tolist(), known.rel.tolist(), known.rhs.tolist(), strict=True))

    def scores_of(side: str, i: int) -> np.ndarray:
        r = edges.rel[i]
        if side == "rhs":
            q = _cx(
                emb[edges.lhs[i]],
                params["lhs_operators.0.real"][r].numpy(),
                params["lhs_operators.0.imag"][r].numpy(),
            )
        else:
            q = _cx(
                emb[edges.rhs[i]],
                params["rhs_operators.0.real"][r].numpy(),
                params["rhs_operators.0.imag"][r].numpy(),
            )
        return emb.astype(np.float64) @ q

    expected = _reference(scores_of, edges, pairs)

    # the same embeddings split over partitions: map single-layout ids to global ids
    members = _layouts(n, parts, rng)
    order = np.concatenate(members)  # global id -> single-layout id
    to_global = np.empty(n, np.int64)
    to_global[order] = np.arange(n)
    cfg = make_config(
        tmp_path,
        entities={"node": {"num_partitions": parts}},
        relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": "complex_diagonal"}],
        dynamic_relations=True,
        dimension=dim,
    )
    write_checkpoint(
        cfg,
        {("node", p): emb[m] for p, m in enumerate(members)},
        [f"r{i}" for i in range(nrel)],
        params=params,
    )
    g_edges = EvalEdges(to_global[edges.lhs], edges.rel, to_global[edges.rhs])
    g_known = KnownEdges(to_global[known.lhs], known.rel, to_global[known.rhs], nrel)
    # tiny chunks and blocks exercise every boundary of the chunked loops
    for kw in ({}, {"chunk_size": 3, "max_scores": 20, "super_chunk": 7}):
        res = _rank(cfg, g_edges, g_known, **kw)
        for side in ("lhs", "rhs"):
            got = res.side(side)
            assert got.raw.tolist() == expected[side][0], (side, kw)
            assert got.filtered.tolist() == expected[side][1], (side, kw)


def test_standard_mode_translation_l2_global_embedding(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n, dim = 20, 4
    emb = _grid(rng, n, dim)
    g = _grid(rng, dim)
    trans = [_grid(rng, dim), _grid(rng, dim)]
    cfg = make_config(
        tmp_path,
        dimension=dim,
        comparator="squared_l2",
        global_emb=True,
        entities={"node": {"num_partitions": 2}},
        relations=[
            {"name": "a", "lhs": "node", "rhs": "node", "operator": "translation"},
            {"name": "b", "lhs": "node", "rhs": "node", "operator": "translation"},
        ],
    )
    params = {
        "global_embs.node": torch.from_numpy(g),
        **{f"rhs_operators.{i}.translation": torch.from_numpy(t) for i, t in enumerate(trans)},
    }
    write_checkpoint(cfg, {("node", 0): emb[:12], ("node", 1): emb[12:]}, ["a", "b"], params=params)
    edges = EvalEdges(rng.integers(0, n, 30), rng.integers(0, 2, 30), rng.integers(0, n, 30))
    x = (emb + g).astype(np.float64)

    def scores_of(side: str, i: int) -> np.ndarray:
        t = trans[edges.rel[i]]
        if side == "rhs":
            return -((x[edges.lhs[i]] - (x + t)) ** 2).sum(1)
        return -((x - (x[edges.rhs[i]] + t)) ** 2).sum(1)

    expected = _reference(scores_of, edges, None)
    res = _rank(cfg, edges, None, chunk_size=4, max_scores=16)
    assert res.lhs.raw.tolist() == expected["lhs"][0]
    assert res.rhs.raw.tolist() == expected["rhs"][0]
    assert res.lhs.filtered is None


def test_progress_reports_every_edge_once(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, entities={"node": {"num_partitions": 2}})
    rng = np.random.default_rng(2)
    write_checkpoint(cfg, {("node", 0): _grid(rng, 5, 2), ("node", 1): _grid(rng, 6, 2)}, ["all"])
    seen: list[float] = []
    edges = EvalEdges(rng.integers(0, 11, 9), np.zeros(9), rng.integers(0, 11, 9))
    _rank(cfg, edges, None, chunk_size=2, max_scores=6, progress=seen.append)
    assert sum(seen) == pytest.approx(9)


def test_several_entity_types_rank_against_their_own_type(tmp_path: Path) -> None:
    """Standard mode with two types: each side is ranked among its own type's entities only,
    and the ranks agree with scores computed one pair at a time through the query API."""
    import bigembed
    from bigembed.eval import evaluate_checkpoint
    from support.checkpoints import write_graph

    users = [["u0", "u1", "u2"], ["u3", "u4"]]
    items = [["i0", "i1", "i2", "i3"]]
    test = [
        ("u0", "buys", "i2"),
        ("u3", "buys", "i0"),
        ("u4", "follows", "u1"),
        ("u2", "follows", "u3"),
    ]
    write_graph(
        tmp_path,
        {"user": users, "item": items},
        ["buys", "follows"],
        {"train": test[:1], "test": test},
        dynamic=False,
        rel_types=USER_ITEM_RELATIONS,
    )
    cfg = user_item_config(tmp_path)
    rng = np.random.default_rng(5)
    emb = {
        ("user", 0): rng.normal(size=(3, 3)),
        ("user", 1): rng.normal(size=(2, 3)),
        ("item", 0): rng.normal(size=(4, 3)),
    }
    write_checkpoint(
        cfg,
        emb,
        ["buys", "follows"],
        params={
            "rhs_operators.0.linear_transformation": torch.randn(3, 3),
            "rhs_operators.1.translation": torch.randn(3),
            "global_embs.user": torch.randn(3),
        },
    )
    model = bigembed.load(cfg.checkpoint_path)
    report = evaluate_checkpoint(cfg, [tmp_path / "test"], filtered=False, per_relation=True)
    ranks: dict[str, list[int]] = {"lhs": [], "rhs": []}

    def rank(names: list[str], scores: np.ndarray, true: str) -> int:
        s_true = scores[names.index(true)]
        return 1 + sum(int(v >= s_true) for n, v in zip(names, scores, strict=True) if n != true)

    for h, r, t in test:
        tails = model.entity_names("item" if r == "buys" else "user")
        ranks["rhs"].append(rank(tails, model.score(h, r, tails), t))
        heads = model.entity_names("user")
        ranks["lhs"].append(rank(heads, model.score(heads, r, t), h))
    for side in ("lhs", "rhs"):
        expected = float(np.mean([1 / x for x in ranks[side]]))
        assert report.sides[side]["raw"]["mrr"] == pytest.approx(expected)
    assert [row["relation"] for row in report.per_relation] == ["buys", "follows"]
    sampled = evaluate_checkpoint(cfg, [tmp_path / "test"], protocol="sampled")
    assert sampled.overall["raw"]["count"] == 2 * len(test)
