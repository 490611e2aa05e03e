"""A planted user/item graph whose item features carry the signal (featurized-type tests).

Each item has one category (feature ``c{k}``) and its own feature ``i{n}``; each user likes
items of one category only. Items are a featurized type; the features file is TSV.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml


def write_featurized_graph(
    root: Path,
    *,
    users: int = 40,
    items: int = 60,
    categories: int = 4,
    edges: int = 1200,
    held_out: int = 0,
    seed: int = 0,
    **overrides: Any,
) -> dict[str, Any]:
    """Write ``edges.tsv``, ``features.tsv`` (items and ``held_out`` extra items with no
    edges) and ``config.yaml`` under ``root``; returns the planted structure."""
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, categories, items + held_out)
    fav = rng.integers(0, categories, users)
    lines = []
    for _ in range(edges):
        u = int(rng.integers(0, users))
        choices = np.flatnonzero(cat[:items] == fav[u])
        lines.append(f"u{u}\tlikes\tit{int(rng.choice(choices))}\n")
    (root / "edges.tsv").write_text("".join(lines))
    (root / "features.tsv").write_text(
        "".join(f"it{n}\tc{cat[n]} i{n}\n" for n in range(items + held_out))
    )
    data = {
        "entities": {
            "user": {"num_partitions": 1},
            "item": {"num_partitions": 1, "featurized": True},
        },
        "relations": [{"name": "likes", "lhs": "user", "rhs": "item", "operator": "none"}],
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "edges")],
        "checkpoint_path": str(root / "model"),
        "dimension": 8,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 5,
        "batch_size": 50,
        "num_batch_negs": 10,
        "num_uniform_negs": 10,
        "lr": 0.1,
        "workers": 1,
        "eval_fraction": 0.0,
        **overrides,
    }
    (root / "config.yaml").write_text(yaml.safe_dump(data))
    return {"cat": cat, "fav": fav, "config": root / "config.yaml"}
