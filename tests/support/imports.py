"""Shared helpers of the graph/import tests: configs, generated edge lists, read-back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bigembed.config import load_config
from bigembed.importing.importer import ImportOptions, run_import
from bigembed.storage import EdgeStore, EntityStore


def write_config(
    tmp: Path,
    *,
    entities: dict[str, int] | None = None,
    relations: list[tuple[str, str, str]] | None = None,
    dynamic: bool = False,
    edge_paths: list[str] | None = None,
    seed: int = 0,
    name: str = "config.yaml",
) -> Path:
    entities = entities or {"node": 2}
    relations = relations or [("r", "node", "node")]
    data: dict[str, Any] = {
        "entities": {k: {"num_partitions": v} for k, v in entities.items()},
        "relations": [{"name": n, "lhs": lhs, "rhs": rhs} for n, lhs, rhs in relations],
        "dynamic_relations": dynamic,
        "entity_path": str(tmp / "out" / "entities"),
        "edge_paths": [str(tmp / "out" / p) for p in (edge_paths or ["edges"])],
        "checkpoint_path": str(tmp / "out" / "model"),
        "dimension": 8,
        "seed": seed,
    }
    if dynamic:
        data["global_emb"] = False
    path = tmp / name
    path.write_text(yaml.safe_dump(data))
    return path


def random_edges(
    n: int, n_entities: int, relations: list[str], seed: int = 0, weights: bool = False
) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(seed)
    lhs = rng.integers(0, n_entities, n)
    rhs = rng.integers(0, n_entities, n)
    rel = rng.integers(0, len(relations), n)
    rows = []
    for i in range(n):
        row: tuple[str, ...] = (f"e{lhs[i]}", relations[rel[i]], f"e{rhs[i]}")
        if weights:
            row += (str([0.25, 1.5, 2.0, 0.125][i % 4]),)
        rows.append(row)
    return rows


def write_tsv(
    path: Path, rows: list[tuple[str, ...]], sep: str = "\t", header: str | None = None
) -> Path:
    lines = [header] if header else []
    lines += [sep.join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def do_import(config: Path, inputs: list[Path], **kwargs: Any):
    cfg = load_config(config)
    options = ImportOptions(inputs=inputs, progress=False, **kwargs)
    return cfg, run_import(cfg, options)


def read_back(
    cfg: Any, edge_path: str | None = None, entity_types: tuple[str, str] | None = None
) -> Counter:
    """Multiset of (lhs name, relation name, rhs name[, weight]) stored in one edge path."""
    entities = EntityStore(cfg.entity_path)
    store = EdgeStore(edge_path or cfg.edge_paths[0])
    rel_names = entities.relation_names()
    out: Counter = Counter()
    for i, j in store.buckets():
        chunk = store.load_bucket(i, j)
        for k in range(len(chunk)):
            rel = int(chunk.rel[k])
            if cfg.dynamic_relations:
                lt, rt = cfg.relations[0].lhs, cfg.relations[0].rhs
            else:
                lt, rt = cfg.relations[rel].lhs, cfg.relations[rel].rhs
            lname = entities.names_array(lt, i)[int(chunk.lhs[k])].as_py()
            rname = entities.names_array(rt, j)[int(chunk.rhs[k])].as_py()
            row: tuple = (lname, rel_names[rel], rname)
            if chunk.weight is not None:
                row += (float(chunk.weight[k]),)
            out[row] += 1
    return out


def leftovers(root: Path) -> list[str]:
    """Hidden temporary files/dirs left anywhere below ``root``."""
    return [
        str(p)
        for p in root.rglob(".*")
        if ".import-" in p.name or ".bigembed-import-" in p.name or p.name.endswith(".tmp")
    ]
