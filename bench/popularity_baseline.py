"""Popularity baseline for filtered link prediction: score = the candidate's train degree.

For a tail query ``(h, r, ?)`` every entity of the tail type scores its number of train edges
as the tail of ``r``; for a head query ``(?, r, t)`` its number as the head of ``r``. Ranks are
filtered like ``bigembed eval``: the other known true answers (train + valid + test edges)
are left out of the candidates. Popularity ties many candidates (every entity of degree 1),
so two figures are printed: ties counted against the true entity (``bigembed eval``'s rule,
``pessimistic``) and the expectation under a random order of the tied candidates (``random
ties``, the fair figure for a baseline). An entity type is the set of names seen on that side
of the relation in any file, or ``--entities`` gives its size (all users, also those with no
edge): candidates with no train edge score 0.

    python bench/popularity_baseline.py --train S/train.tsv --known S/valid.tsv S/test.tsv \
        --edges S/test_sample.tsv --same-type

``--same-type`` (one entity type on both sides, as in a social graph) ranks heads and tails
among the same set of names; ``--exclude-self`` then leaves the query entity out of its own
candidates (nobody is recommended to follow themselves), as a filter file of the self-pairs
``u follows u`` does for ``bigembed eval``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _read(path: Path) -> np.ndarray:
    """Rows of (head, relation, tail) names of a TSV without header."""
    rows = [line.split("\t")[:3] for line in path.read_text(encoding="utf-8").splitlines() if line]
    return np.asarray(rows, dtype=object).reshape(-1, 3)


def _ids(names: np.ndarray, index: dict[str, int]) -> np.ndarray:
    for name in names:
        if name not in index:
            index[name] = len(index)
    return np.fromiter((index[n] for n in names), dtype=np.int64, count=len(names))


def filtered_ranks(
    scores: np.ndarray, true: np.ndarray, known: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per query: (pessimistic rank, expected reciprocal rank under random tie order).

    ``scores``: one score per candidate (the same for every query: popularity does not depend
    on the query); ``true``: the true candidate per query; ``known[q]``: the other true
    candidates of query q (left out). Exact, O(log N) per query plus its known answers."""
    ordered = np.sort(scores)
    n = len(scores)
    harmonic = np.concatenate(([0.0], np.cumsum(1.0 / np.arange(1, n + 1))))
    pess = np.empty(len(true), dtype=np.float64)
    rr = np.empty(len(true), dtype=np.float64)
    for q, t in enumerate(true):
        s = scores[t]
        greater = n - np.searchsorted(ordered, s, side="right")
        ties = np.searchsorted(ordered, s, side="right") - np.searchsorted(ordered, s, "left") - 1
        others = known[q]
        others = np.unique(others[others != t])
        greater -= int(np.sum(scores[others] > s))
        ties -= int(np.sum(scores[others] == s))
        pess[q] = 1 + greater + ties
        # mean of 1/(1 + greater + k) for k = 0..ties: (H(greater+ties+1) - H(greater)) / (ties+1)
        rr[q] = (harmonic[greater + ties + 1] - harmonic[greater]) / (ties + 1)
    return pess, rr


def evaluate(
    train: np.ndarray,
    known_rows: np.ndarray,
    edges: np.ndarray,
    same_type: bool,
    entities: tuple[int | None, int | None],
    exclude_self: bool = False,
) -> dict[str, dict[str, float]]:
    """Filtered MRR / Hits of the popularity scorer on ``edges``, per side and both."""
    rel_index: dict[str, int] = {}
    heads_index: dict[str, int] = {}
    tails_index = heads_index if same_type else {}
    every = np.concatenate((train, known_rows, edges))
    h_all = _ids(every[:, 0], heads_index)
    r_all = _ids(every[:, 1], rel_index)
    t_all = _ids(every[:, 2], tails_index)
    n_heads = max(len(heads_index), entities[0] or 0)
    n_tails = max(len(tails_index), entities[1] or 0)
    n_train = len(train)
    e0 = len(every) - len(edges)
    out: dict[str, dict[str, float]] = {}
    per_side: list[tuple[np.ndarray, np.ndarray]] = []
    for side in ("head", "tail"):
        pess_all, rr_all = [], []
        for r in range(len(rel_index)):
            mine = r_all == r
            query_ids = np.nonzero(mine[e0:])[0] + e0
            if len(query_ids) == 0:
                continue
            train_mask = mine[:n_train]
            if side == "tail":
                scores = np.bincount(t_all[:n_train][train_mask], minlength=n_tails).astype(float)
                key_all, ans_all = h_all, t_all
            else:
                scores = np.bincount(h_all[:n_train][train_mask], minlength=n_heads).astype(float)
                key_all, ans_all = t_all, h_all
            keys, answers = key_all[mine], ans_all[mine]
            order = np.argsort(keys, kind="stable")
            keys_sorted, answers_sorted = keys[order], answers[order]
            known = []
            for k in key_all[query_ids]:
                lo, hi = np.searchsorted(keys_sorted, [k, k + 1])
                mine_known = answers_sorted[lo:hi]
                known.append(np.append(mine_known, k) if exclude_self else mine_known)
            pess, rr = filtered_ranks(scores, ans_all[query_ids], known)
            pess_all.append(pess)
            rr_all.append(rr)
        per_side.append((np.concatenate(pess_all), np.concatenate(rr_all)))
    for name, parts in (("head", [per_side[0]]), ("tail", [per_side[1]]), ("both", per_side)):
        pess = np.concatenate([p for p, _ in parts])
        rr = np.concatenate([r for _, r in parts])
        out[name] = {
            "ranks": float(len(pess)),
            "mrr_pessimistic": float(np.mean(1.0 / pess)),
            "hits1_pessimistic": float(np.mean(pess <= 1)),
            "hits10_pessimistic": float(np.mean(pess <= 10)),
            "mrr_random_ties": float(np.mean(rr)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train", type=Path, required=True, help="train edges (the degrees)")
    parser.add_argument("--known", type=Path, nargs="*", default=[], help="more filter edges")
    parser.add_argument("--edges", type=Path, required=True, help="edges to rank")
    parser.add_argument("--same-type", action="store_true", help="one entity type")
    parser.add_argument("--entities", type=int, nargs=2, metavar=("HEADS", "TAILS"))
    parser.add_argument(
        "--exclude-self",
        action="store_true",
        help="with --same-type: the query entity is not a candidate (as if u -> u were known)",
    )
    args = parser.parse_args(argv)
    train = _read(args.train)
    known = [_read(p) for p in args.known]
    edges = _read(args.edges)
    known_rows = np.concatenate(known) if known else np.empty((0, 3), dtype=object)
    sizes = tuple(args.entities) if args.entities else (None, None)
    result = evaluate(train, known_rows, edges, args.same_type, sizes, args.exclude_self)
    what = "filtered, query entity excluded" if args.exclude_self else "filtered"
    print(f"popularity baseline on {args.edges} ({len(edges):,} edges), {what}")
    print(f"{'side':<6}{'ranks':>9}{'MRR pess':>10}{'Hits@1':>8}{'Hits@10':>9}{'MRR rnd ties':>14}")
    for side, m in result.items():
        print(
            f"{side:<6}{int(m['ranks']):>9}{m['mrr_pessimistic']:>10.4f}"
            f"{m['hits1_pessimistic']:>8.4f}{m['hits10_pessimistic']:>9.4f}"
            f"{m['mrr_random_ties']:>14.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
