"""Featurized items against plain items on a planted user/item graph where attributes matter.

Each item has a category and a brand (its features, with its own id feature); each user likes
items of one favourite category (with probability ``--focus``, else any item). Some items are
held out of training entirely: their edges are test edges only. The same graph is trained twice
with the same config, items plain (``featurized: false``) and featurized (features
``cat:C brand:B id:N``); both are ranked on the test edges, tails (items) against every item
of the catalogue, filtered (the user's other known items left out):

* seen items: test edges to items that have training edges (10% of their edges held back);
* new items: test edges to the held-out items. The featurized model embeds them from their
  known features (category and brand; their id features were never trained and the store
  does not know them), with ``model.embed``; the plain model has no row for them: they get
  the zero vector (score 0), the best a model without features can say.

    python bench/featurized_bench.py                   # small: about a minute on 2 cores
    python bench/featurized_bench.py --users 5000 --items 3000 --edges 100000 --epochs 5
    python bench/featurized_bench.py --partitions 2    # 2 x 2 buckets, one feature table
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import bigembed
from bigembed.config import ConfigSchema, parse_config_dict
from bigembed.edgelists import ColumnSpec
from bigembed.importing import ImportOptions, run_import
from bigembed.train import train


def planted(args: argparse.Namespace, root: Path) -> dict[str, np.ndarray]:
    """Write train.tsv, features.tsv; return the test edges and the catalogue."""
    rng = np.random.default_rng(args.seed)
    n_items = args.items + args.new_items
    cat = rng.integers(0, args.categories, n_items)
    brand = rng.integers(0, args.brands, n_items)
    fav = rng.integers(0, args.categories, args.users)
    by_cat = [np.flatnonzero(cat == c) for c in range(args.categories)]
    users = rng.integers(0, args.users, args.edges)
    focused = rng.random(args.edges) < args.focus
    items = np.where(
        focused,
        [rng.choice(by_cat[fav[u]]) for u in users],
        rng.integers(0, n_items, args.edges),
    )
    pairs = np.unique(np.stack([users, items], 1), axis=0)
    new = pairs[:, 1] >= args.items
    held = (~new) & (rng.random(len(pairs)) < 0.1)
    train = pairs[~new & ~held]
    (root / "train.tsv").write_text("".join(f"u{u}\tlikes\tit{i}\n" for u, i in train))
    (root / "features.tsv").write_text(
        "".join(f"it{n}\tcat:{cat[n]} brand:{brand[n]} id:{n}\n" for n in range(n_items))
    )
    return {"train": train, "seen": pairs[held], "new": pairs[new], "cat": cat, "brand": brand}


def config(root: Path, name: str, featurized: bool, args: argparse.Namespace) -> ConfigSchema:
    data = {
        "entities": {
            "user": {"num_partitions": args.partitions},
            "item": {"num_partitions": args.partitions, "featurized": featurized},
        },
        "relations": [{"name": "likes", "lhs": "user", "rhs": "item", "operator": "none"}],
        "entity_path": str(root / name / "entities"),
        "edge_paths": [str(root / name / "edges")],
        "checkpoint_path": str(root / name / "model"),
        "dimension": args.dim,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": args.epochs,
        "batch_size": 1000,
        "num_batch_negs": 100,
        "num_uniform_negs": 100,
        "lr": 0.1,
        "workers": args.workers,
        "eval_fraction": 0.0,
    }
    return parse_config_dict(data)


def filtered_mrr(
    user_vecs: np.ndarray, items: np.ndarray, test: np.ndarray, known: dict[int, set[int]]
) -> float:
    """Filtered MRR of each test edge's item among all ``items`` rows (dot scores)."""
    rr = []
    for u, i in test:
        scores = items @ user_vecs[u]
        target = scores[i]
        better = scores > target
        for j in known.get(u, ()):  # the user's other true items do not count
            if j != i:
                better[j] = False
        rr.append(1.0 / (1 + int(better.sum())))
    return float(np.mean(rr)) if rr else float("nan")


def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="featurized-bench-"))
    try:
        g = planted(args, root)
        n_items = args.items + args.new_items
        known: dict[int, set[int]] = {}
        for u, i in np.concatenate([g["train"], g["seen"], g["new"]]):
            known.setdefault(int(u), set()).add(int(i))
        print(
            f"graph: {args.users} users, {args.items} items (+{args.new_items} held out), "
            f"{len(g['train'])} train edges, {len(g['seen'])} seen-item and {len(g['new'])} "
            f"new-item test edges, {args.categories} categories, {args.brands} brands, "
            f"{args.partitions} partition(s) per type"
        )
        for name, featurized in (("plain", False), ("featurized", True)):
            cfg = config(root, name, featurized, args)
            features = {"item": root / "features.tsv"} if featurized else {}
            options = ImportOptions(
                inputs=[root / "train.tsv"],
                columns=ColumnSpec(lhs=0, rel=1, rhs=2),
                progress=False,
                features=features,
            )
            run_import(cfg, options)
            t0 = time.perf_counter()
            train(cfg, progress=False)
            seconds = time.perf_counter() - t0
            model = bigembed.load(root / name / "model")
            users = model.vectors([f"u{u}" for u in range(args.users)], type="user")
            dim = users.shape[1]
            table = np.zeros((n_items, dim), np.float32)
            trained = model.entity_names("item")
            rows = [int(n[2:]) for n in trained]
            table[rows] = model.vectors(trained, type="item")
            if featurized:
                missing = [n for n in range(n_items) if n not in set(rows)]
                bags = [[f"cat:{g['cat'][n]}", f"brand:{g['brand'][n]}"] for n in missing]
                if missing:
                    table[missing] = model.embed(bags, type="item")
            seen = filtered_mrr(users, table, g["seen"], known)
            new = filtered_mrr(users, table, g["new"], known)
            print(
                f"{name:>10}: filtered MRR seen items {seen:.4f}, new items {new:.4f} "
                f"(train {seconds:.1f} s)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=600)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--new-items", type=int, default=40)
    p.add_argument("--categories", type=int, default=20)
    p.add_argument("--brands", type=int, default=30)
    p.add_argument("--edges", type=int, default=12000)
    p.add_argument("--focus", type=float, default=0.8)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--partitions", type=int, default=1, help="of users and items alike")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


if __name__ == "__main__":
    run(parse_args())
