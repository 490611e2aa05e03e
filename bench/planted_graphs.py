"""Graphs with planted, learnable structure, for measuring the social and user/item recipes.

No real social or rating data set is available on the development machine, so the recipes
``examples/social_graph.yaml`` and ``examples/user_item.yaml`` are measured on graphs drawn
from known generative models. Held-out link prediction on them measures whether a model
recovers the planted structure beyond what popularity (degree) alone explains; a popularity
baseline (``bench/popularity_baseline.py``) gives the floor. The figures say nothing about
how hard *your* graph is: they are for comparing configurations, not for promising an MRR.

**Social graph** (``social``): one relation ``follows`` between users ``u<id>``; a
hierarchical degree-corrected stochastic block model with reciprocity.

* Communities: ``macro`` groups of ``micro`` communities each (16 x 16 = 256 by default).
  Community sizes are lognormal (sigma 0.7): some communities are several times larger.
* Each user has an out-propensity (activity) ``a ~ Pareto(2.2)`` and an in-propensity
  (popularity) ``p ~ Pareto(1.6)``, capped at 1000 x the minimum: power-law out- and in-degrees
  with a few very popular accounts.
* ``edges`` primary edges: the source is drawn in proportion to ``a``; the target, in proportion
  to ``p``, from the source's own micro community with probability ``p_micro`` (0.55), else
  from its macro group with probability ``p_macro`` (0.30), else from all users (0.15).
* Reciprocity: each primary edge ``u -> v`` is answered by ``v -> u`` with probability
  ``reciprocity`` (0.3), as mutual follows are in real social graphs.
* Self-loops and duplicate edges are dropped.

A model that learns communities can rank a held-out ``u -> ?`` target among the ~800 members
of ``u``'s micro community (weighted by popularity); a popularity model ranks it among all
200,000 users.

**User/item graph** (``user_item``): users ``u<id>`` and items ``i<id>``, relations ``viewed``
and ``bought`` (user -> item); a latent genre-mixture model.

* Items: a genre (``genres``, 32 by default, genre sizes Dirichlet(2)), a popularity
  ``pi ~ Pareto(1.1)`` (capped; best-sellers) and a latent quality ``q ~ N(0, 1)``.
* Users: genre preferences ``theta ~ Dirichlet(0.15)`` (most users like a few genres) and
  an activity ``a ~ Pareto(2.0)``.
* ``views`` view draws: the user in proportion to ``a``; with probability ``p_genre`` (0.85)
  a genre from ``theta_u`` and an item of that genre in proportion to ``pi``, else any item
  in proportion to ``pi`` (browsing noise). Repeated views of one pair are one edge.
* ``bought``: each view is a purchase with probability
  ``sigmoid(buy_bias + 1.5 log(G theta_u[g_i]) + q_i)``: a noisy subset of the views,
  concentrated on the user's favourite genres and on good items (``q`` is never shown).

Both generators are seeded (same arguments, same edges) and vectorised with numpy: the
default sizes take a few seconds. The TSV (``head<TAB>relation<TAB>tail``, no header) is ready
for ``bigembed split``:

    python bench/planted_graphs.py social --output work/planted/follows.tsv
    python bench/planted_graphs.py user_item --output work/planted/interactions.tsv
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class PlantedGraph:
    """Edges as integer arrays, with the planted labels the tests and statistics use."""

    heads: np.ndarray  # int64 ids of the head type
    rels: np.ndarray  # int64 index into rel_names
    tails: np.ndarray  # int64 ids of the tail type
    rel_names: tuple[str, ...]
    head_prefix: str
    tail_prefix: str
    num_heads: int
    num_tails: int
    head_group: np.ndarray  # social: micro community per user; user/item: favourite genre
    tail_group: np.ndarray  # social: micro community per user; user/item: item genre


def _pareto(rng: np.random.Generator, shape: float, n: int, cap: float = 1000.0) -> np.ndarray:
    """Pareto(xm=1) draws capped at ``cap`` (keeps one account from taking every edge)."""
    return np.minimum(rng.pareto(shape, n) + 1.0, cap)


def _draw_within(
    rng: np.random.Generator,
    weights: np.ndarray,
    group_of: np.ndarray,
    num_groups: int,
    groups: np.ndarray,
) -> np.ndarray:
    """For each entry of ``groups``, an id of that group drawn in proportion to ``weights``.

    Ids are sorted by group once; a draw is a uniform point within its group's stretch of the
    cumulative weights, found by binary search (vectorised over all draws)."""
    order = np.argsort(group_of, kind="stable")
    cum = np.cumsum(weights[order])
    sizes = np.bincount(group_of, minlength=num_groups)
    ends_idx = np.cumsum(sizes)
    starts = np.concatenate(([0.0], cum))[ends_idx - sizes]
    ends = np.concatenate(([0.0], cum))[ends_idx]
    points = starts[groups] + rng.random(len(groups)) * (ends[groups] - starts[groups])
    idx = np.searchsorted(cum, points, side="right")
    return order[np.minimum(idx, len(order) - 1)]


def _dedupe(
    heads: np.ndarray, rels: np.ndarray, tails: np.ndarray, num_tails: int, num_rels: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = (heads * num_rels + rels) * num_tails + tails
    _, first = np.unique(key, return_index=True)
    first.sort()  # keep the draw order (a shuffle of the edges, reproducible)
    return heads[first], rels[first], tails[first]


def social_graph(
    num_users: int = 200_000,
    edges: int = 600_000,
    macro: int = 16,
    micro: int = 16,
    p_micro: float = 0.55,
    p_macro: float = 0.30,
    reciprocity: float = 0.3,
    seed: int = 0,
) -> PlantedGraph:
    """The hierarchical degree-corrected block model of the module docstring."""
    rng = np.random.default_rng(seed)
    num_comm = macro * micro
    comm_weight = rng.lognormal(0.0, 0.7, num_comm)
    community = rng.choice(num_comm, size=num_users, p=comm_weight / comm_weight.sum())
    group = community // micro  # micro communities m*micro .. m*micro+micro-1 form macro m
    activity = _pareto(rng, 2.2, num_users)
    popularity = _pareto(rng, 1.6, num_users)

    src = rng.choice(num_users, size=edges, p=activity / activity.sum())
    scope = rng.random(edges)
    dst = np.empty(edges, dtype=np.int64)
    in_micro = scope < p_micro
    in_macro = (~in_micro) & (scope < p_micro + p_macro)
    anywhere = ~(in_micro | in_macro)
    dst[in_micro] = _draw_within(rng, popularity, community, num_comm, community[src[in_micro]])
    dst[in_macro] = _draw_within(rng, popularity, group, macro, group[src[in_macro]])
    dst[anywhere] = _draw_within(
        rng, popularity, np.zeros(num_users, np.int64), 1, np.zeros(anywhere.sum(), np.int64)
    )
    back = rng.random(edges) < reciprocity
    heads = np.concatenate((src, dst[back]))
    tails = np.concatenate((dst, src[back]))
    # interleave the answers among the primary edges (a file's order carries no signal)
    perm = rng.permutation(len(heads))
    heads, tails = heads[perm], tails[perm]
    keep = heads != tails
    heads, tails = heads[keep], tails[keep]
    rels = np.zeros(len(heads), dtype=np.int64)
    heads, rels, tails = _dedupe(heads, rels, tails, num_users, 1)
    return PlantedGraph(
        heads, rels, tails, ("follows",), "u", "u", num_users, num_users, community, community
    )


def user_item_graph(
    num_users: int = 100_000,
    num_items: int = 10_000,
    views: int = 900_000,
    genres: int = 32,
    p_genre: float = 0.85,
    buy_bias: float = -3.8,
    seed: int = 0,
) -> PlantedGraph:
    """The genre-mixture model of the module docstring."""
    rng = np.random.default_rng(seed)
    genre_share = rng.dirichlet(np.full(genres, 2.0))
    item_genre = rng.choice(genres, size=num_items, p=genre_share)
    item_pop = _pareto(rng, 1.1, num_items, cap=2000.0)
    quality = rng.normal(0.0, 1.0, num_items)
    theta = rng.dirichlet(np.full(genres, 0.15), size=num_users)
    activity = _pareto(rng, 2.0, num_users)

    users = rng.choice(num_users, size=views, p=activity / activity.sum())
    cum = np.cumsum(theta[users], axis=1)
    genre = np.minimum((cum < rng.random(views)[:, None]).sum(axis=1), genres - 1)
    items = _draw_within(rng, item_pop, item_genre, genres, genre)
    noise = rng.random(views) >= p_genre
    items[noise] = _draw_within(
        rng, item_pop, np.zeros(num_items, np.int64), 1, np.zeros(noise.sum(), np.int64)
    )
    users, _, items = _dedupe(users, np.zeros(views, np.int64), items, num_items, 1)
    affinity = np.log(genres * theta[users, item_genre[items]] + 1e-12)
    logit = buy_bias + 1.5 * affinity + quality[items]
    bought = rng.random(len(users)) < 1.0 / (1.0 + np.exp(-logit))
    heads = np.concatenate((users, users[bought]))
    tails = np.concatenate((items, items[bought]))
    rels = np.concatenate((np.zeros(len(users), np.int64), np.ones(int(bought.sum()), np.int64)))
    perm = rng.permutation(len(heads))
    return PlantedGraph(
        heads[perm],
        rels[perm],
        tails[perm],
        ("viewed", "bought"),
        "u",
        "i",
        num_users,
        num_items,
        theta.argmax(axis=1),
        item_genre,
    )


def within_group_share(graph: PlantedGraph) -> tuple[float, float]:
    """(share of edges whose head and tail share a group, the share expected by chance).

    Chance: the head's group matched against a tail drawn from the tails' own group mix."""
    same = float(np.mean(graph.head_group[graph.heads] == graph.tail_group[graph.tails]))
    size = max(int(graph.head_group.max()), int(graph.tail_group.max())) + 1
    head_mix = np.bincount(graph.head_group[graph.heads], minlength=size) / len(graph.heads)
    tail_mix = np.bincount(graph.tail_group[graph.tails], minlength=size) / len(graph.tails)
    return same, float(head_mix @ tail_mix)


def statistics(graph: PlantedGraph) -> list[str]:
    """One line per fact: counts, degree skew, reciprocity, planted structure."""
    lines = [f"edges: {len(graph.heads):,}"]
    for r, name in enumerate(graph.rel_names):
        lines.append(f"  {name}: {int(np.sum(graph.rels == r)):,}")
    for side, ids, n in (
        ("head (out)", graph.heads, graph.num_heads),
        ("tail (in)", graph.tails, graph.num_tails),
    ):
        deg = np.bincount(ids, minlength=n)
        top = np.sort(deg)[::-1]
        lines.append(
            f"{side} degree over {n:,} entities: mean {deg.mean():.2f}, median "
            f"{np.median(deg):.0f}, max {deg.max():,}, zero {np.mean(deg == 0):.1%}, "
            f"top 1% hold {top[: max(1, n // 100)].sum() / deg.sum():.1%} of edges"
        )
    if graph.head_prefix == graph.tail_prefix:
        key = graph.heads * graph.num_tails + graph.tails
        rev = graph.tails * graph.num_tails + graph.heads
        lines.append(f"reciprocated edges: {np.isin(key, rev).mean():.1%}")
    else:
        both = np.isin(
            graph.heads[graph.rels == 1] * graph.num_tails + graph.tails[graph.rels == 1],
            graph.heads[graph.rels == 0] * graph.num_tails + graph.tails[graph.rels == 0],
        )
        if both.size:
            lines.append(f"bought edges whose pair is also viewed: {both.mean():.1%}")
    same, chance = within_group_share(graph)
    what = "same micro community" if graph.head_prefix == graph.tail_prefix else "user's top genre"
    lines.append(f"edges within the {what}: {same:.1%} (chance {chance:.2%})")
    return lines


def write_tsv(graph: PlantedGraph, path: Path) -> None:
    """``head<TAB>relation<TAB>tail`` lines, written to a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    heads = np.char.add(graph.head_prefix, graph.heads.astype(str))
    tails = np.char.add(graph.tail_prefix, graph.tails.astype(str))
    rels = np.asarray(graph.rel_names)[graph.rels]
    lines = np.char.add(np.char.add(np.char.add(heads, "\t"), np.char.add(rels, "\t")), tails)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text("\n".join(lines.tolist()) + "\n", encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=("social", "user_item"))
    parser.add_argument("--output", type=Path, required=True, help="TSV file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, help="users (200,000 social, 100,000 user/item)")
    parser.add_argument("--items", type=int, default=10_000, help="items (user_item)")
    parser.add_argument(
        "--draws", type=int, help="primary edges (social, 600,000) or view draws (900,000)"
    )
    args = parser.parse_args(argv)
    if args.output.exists():
        print(f"planted_graphs: {args.output}: exists; refusing to overwrite", file=sys.stderr)
        return 1
    if args.kind == "social":
        graph = social_graph(
            num_users=args.users or 200_000, edges=args.draws or 600_000, seed=args.seed
        )
    else:
        graph = user_item_graph(
            num_users=args.users or 100_000,
            num_items=args.items,
            views=args.draws or 900_000,
            seed=args.seed,
        )
    write_tsv(graph, args.output)
    print(f"{args.kind} graph (seed {args.seed}) -> {args.output}")
    for line in statistics(graph):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
