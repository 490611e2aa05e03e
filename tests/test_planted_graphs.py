"""bench/planted_graphs.py draws reproducible graphs whose planted structure is really there,
and bench/popularity_baseline.py ranks like ``bigembed eval`` (filtered, ties against)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import planted_graphs as pg  # noqa: E402
import popularity_baseline as pb  # noqa: E402


def _arrays(graph: pg.PlantedGraph) -> tuple[np.ndarray, ...]:
    return graph.heads, graph.rels, graph.tails, graph.head_group, graph.tail_group


def test_same_seed_same_graph_other_seed_other_graph() -> None:
    for make in (
        lambda s: pg.social_graph(num_users=3000, edges=12_000, seed=s),
        lambda s: pg.user_item_graph(num_users=2000, num_items=300, views=15_000, seed=s),
    ):
        a, b, c = make(1), make(1), make(2)
        for x, y in zip(_arrays(a), _arrays(b), strict=True):
            assert np.array_equal(x, y)
        assert not np.array_equal(a.tails, c.tails[: len(a.tails)])


def test_social_graph_has_communities_reciprocity_and_hubs() -> None:
    g = pg.social_graph(num_users=5000, edges=25_000, seed=0)
    assert len(g.heads) > 25_000  # the answered follows came on top
    assert np.all(g.heads != g.tails)
    keys = g.heads * g.num_tails + g.tails
    assert len(np.unique(keys)) == len(keys)  # no duplicate edge
    same, chance = pg.within_group_share(g)
    assert same > 0.45 and chance < 0.02  # planted: ~55% in the micro community
    reciprocated = np.isin(keys, g.tails * g.num_tails + g.heads).mean()
    assert reciprocated > 0.3  # ~0.3 answered, both directions counted
    indeg = np.bincount(g.tails, minlength=g.num_tails)
    assert indeg.max() > 15 * indeg.mean()  # power-law popularity, not Poisson


def test_user_item_graph_bought_is_a_taste_driven_subset_of_viewed() -> None:
    g = pg.user_item_graph(num_users=4000, num_items=500, views=40_000, seed=0)
    viewed = g.heads[g.rels == 0] * g.num_tails + g.tails[g.rels == 0]
    bought = g.heads[g.rels == 1] * g.num_tails + g.tails[g.rels == 1]
    assert 0.05 < len(bought) / len(viewed) < 0.4
    assert np.isin(bought, viewed).all()
    same, chance = pg.within_group_share(g)
    assert same > 5 * chance
    on_taste = g.head_group[g.heads] == g.tail_group[g.tails]
    assert on_taste[g.rels == 1].mean() > on_taste[g.rels == 0].mean() + 0.1


def test_tsv_is_ready_for_split(tmp_path: Path) -> None:
    g = pg.user_item_graph(num_users=200, num_items=50, views=800, seed=3)
    path = tmp_path / "x.tsv"
    pg.write_tsv(g, path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(g.heads)
    h, r, t = lines[0].split("\t")
    assert (h, r, t) == (f"u{g.heads[0]}", g.rel_names[g.rels[0]], f"i{g.tails[0]}")


def test_popularity_ranks_filtered_with_ties_against_the_true_entity() -> None:
    scores = np.array([5.0, 3.0, 3.0, 3.0, 1.0, 0.0])
    # true 2 (score 3): above it 0; tied 1 and 3; 1 is a known answer, so left out
    pess, rr = pb.filtered_ranks(scores, np.array([2, 4]), [np.array([1, 2]), np.array([0])])
    assert pess.tolist() == [3.0, 4.0]  # 0, 3 (tie), 2; then 1, 2, 3 above 4 (0 filtered)
    assert np.isclose(rr[0], (1 / 2 + 1 / 3) / 2)
    assert np.isclose(rr[1], 1 / 4)


def test_an_existing_output_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "graph.tsv"
    out.write_text("mine\n")
    assert pg.main(["social", "--output", str(out), "--users", "50", "--draws", "100"]) == 1
    assert out.read_text() == "mine\n"
    assert "exists" in capsys.readouterr().err
