"""Small generated graphs written straight into bigembed's storage format (no importer needed).

Edges follow a planted structure (an edge (h, r, t) exists mostly when t is among h's
"neighbours" under r), so a model can learn them and quality checks are meaningful.
:func:`write_graph` and :func:`graph_config` make a graph of one entity type;
:func:`write_buckets` writes chosen edges bucket by bucket (several entity types, relations
confined to buckets) for the distributed tests that need a given layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bigembed.config import ConfigSchema, config_to_dict, parse_config_dict
from bigembed.storage.edges import write_edge_manifest
from bigembed.storage.entities import write_entity_store
from bigembed.storage.format import bucket_dir


def write_graph(
    root: Path,
    *,
    num_entities: int = 200,
    num_edges: int = 3000,
    num_partitions: int = 1,
    num_relations: int = 3,
    weights: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """One entity type ``node``, relations ``r0..``; stores in ``root/entities``, ``root/edges``.

    Returns the global edge arrays for checks.
    """
    rng = np.random.default_rng(seed)
    heads = rng.integers(0, num_entities, num_edges)
    rels = rng.integers(0, num_relations, num_edges)
    # planted structure: tail = (head * (r + 2) + small noise) mod N
    tails = (heads * (rels + 2) + rng.integers(0, 3, num_edges)) % num_entities
    names = np.array([f"n{i}" for i in range(num_entities)])
    perm = rng.permutation(num_entities)  # global id -> (partition, offset) through a shuffle
    bounds = np.linspace(0, num_entities, num_partitions + 1).astype(int)
    part_of = np.empty(num_entities, np.int64)
    off_of = np.empty(num_entities, np.int64)
    part_names = []
    for p in range(num_partitions):
        members = perm[bounds[p] : bounds[p + 1]]
        part_of[members] = p
        off_of[members] = np.arange(len(members))
        part_names.append(pa.array(names[members].tolist()))
    write_entity_store(
        root / "entities",
        names={"node": part_names},
        relation_names=[f"r{k}" for k in range(num_relations)],
        dynamic_relations=True,
        seed=seed,
    )
    edir = root / "edges"
    counts = np.zeros((num_partitions, num_partitions), np.int64)
    w = rng.uniform(0.5, 2.0, num_edges).astype(np.float32) if weights else None
    for i in range(num_partitions):
        for j in range(num_partitions):
            sel = np.nonzero((part_of[heads] == i) & (part_of[tails] == j))[0]
            sel = rng.permutation(sel)
            counts[i, j] = len(sel)
            if len(sel) == 0:
                continue
            d = edir / bucket_dir(i, j)
            d.mkdir(parents=True, exist_ok=True)
            np.save(d / "lhs.npy", off_of[heads[sel]].astype(np.int32))
            np.save(d / "rhs.npy", off_of[tails[sel]].astype(np.int32))
            np.save(d / "rel.npy", rels[sel].astype(np.int32))
            if w is not None:
                np.save(d / "weight.npy", w[sel])
    dtypes: dict[str, np.dtype] = {k: np.dtype(np.int32) for k in ("lhs", "rhs", "rel")}
    if w is not None:
        dtypes["weight"] = np.dtype(np.float32)
    edir.mkdir(parents=True, exist_ok=True)
    write_edge_manifest(edir, bucket_counts=counts, dtypes=dtypes, has_weights=weights)
    return {"heads": heads, "rels": rels, "tails": tails, "names": names}


def graph_config(root: Path, **overrides: Any) -> ConfigSchema:
    """A config for :func:`write_graph`'s output (dynamic relations unless overridden)."""
    num_partitions = overrides.pop("num_partitions", 1)
    data: dict[str, Any] = {
        "entities": {"node": {"num_partitions": num_partitions}},
        "relations": [{"name": "all", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
        "dynamic_relations": True,
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "edges")],
        "checkpoint_path": str(root / "model"),
        "dimension": 16,
        "global_emb": False,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 2,
        "batch_size": 100,
        "num_batch_negs": 20,
        "num_uniform_negs": 20,
        "lr": 0.1,
        "eval_fraction": 0.0,
        "workers": 1,
    }
    data.update(overrides)
    return parse_config_dict(data)


def budget_for(
    capacity: int, table_bytes: int, *, workers: int, edges: int, read_ahead: bool = True
) -> int:
    """A ``memory_budget`` that holds ``capacity`` partitions of ``table_bytes`` (and not one
    more) by the memory model of :mod:`bigembed.train.memory.budget`; ``edges``: an upper bound
    on a bucket chunk's edges, at most half a table's bytes of edge buffers above the truth;
    ``read_ahead``: ``partition_prefetch`` (on by default)."""
    from bigembed.train.memory.budget import BASE_BYTES, WORKER_BYTES, edge_bytes

    fixed = BASE_BYTES + workers * WORKER_BYTES + edges * edge_bytes(read_ahead)
    return fixed + capacity * table_bytes + table_bytes // 4


def tiny_kg_config_file(
    root: Path, num_entities: int, num_edges: int, *, valid: bool = False, **overrides: Any
) -> tuple[Path, Path | None]:
    """A tiny dynamic-relation graph and its ``config.yaml`` for CLI tests (d = 8, one worker).

    ``valid``: also write ``valid.tsv``, one edge per entity drawn from the planted structure
    ``tail = head * (rel + 2) mod n`` (edges the training data mostly lacks). Returns the
    config path and the validation file (None without ``valid``)."""
    import yaml

    graph = write_graph(root, num_entities=num_entities, num_edges=num_edges)
    valid_path = None
    if valid:
        rng = np.random.default_rng(7)
        heads = rng.integers(0, num_entities, num_entities)
        rels = rng.integers(0, 3, num_entities)
        tails = (heads * (rels + 2)) % num_entities
        names = graph["names"]
        valid_path = root / "valid.tsv"
        valid_path.write_text(
            "".join(
                f"{names[h]}\tr{r}\t{names[t]}\n"
                for h, r, t in zip(heads, rels, tails, strict=True)
            )
        )
    data = {
        "entities": {"node": {"num_partitions": 1}},
        "relations": [{"name": "all", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
        "dynamic_relations": True,
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "edges")],
        "checkpoint_path": str(root / "model"),
        "dimension": 8,
        "global_emb": False,
        "batch_size": 100,
        "num_batch_negs": 10,
        "num_uniform_negs": 10,
        "workers": 1,
        **overrides,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, valid_path


# ---------------------------------------------------------------------- bucket by bucket
Edges = tuple[np.ndarray, np.ndarray, np.ndarray]  # lhs offsets, rel ids, rhs offsets


def write_buckets(
    root: Path,
    counts: dict[str, list[int]],
    relation_names: list[str],
    dynamic: bool,
    buckets: dict[tuple[int, int], Edges],
    nparts: tuple[int, int],
) -> None:
    """An entity store with ``counts[type][part]`` entities and the given buckets' edges."""
    names = {
        t: [pa.array([f"{t}{p}_{k}" for k in range(n)]) for p, n in enumerate(parts)]
        for t, parts in counts.items()
    }
    write_entity_store(
        root / "entities",
        names=names,
        relation_names=relation_names,
        dynamic_relations=dynamic,
        seed=0,
    )
    edir = root / "edges"
    table = np.zeros(nparts, np.int64)
    for (i, j), (lhs, rel, rhs) in buckets.items():
        d = edir / bucket_dir(i, j)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "lhs.npy", lhs.astype(np.int32))
        np.save(d / "rhs.npy", rhs.astype(np.int32))
        np.save(d / "rel.npy", rel.astype(np.int32))
        table[i, j] = len(lhs)
    dtypes = {k: np.dtype(np.int32) for k in ("lhs", "rhs", "rel")}
    write_edge_manifest(edir, bucket_counts=table, dtypes=dtypes, has_weights=False)


def planted(
    rng: np.random.Generator,
    n_lhs: int,
    n_rhs: int,
    n: int,
    rel: int,
    rhs_lo: int = 0,
    rhs_hi: int | None = None,
) -> Edges:
    """Learnable edges: rhs = lhs * 3 + noise, folded into [rhs_lo, rhs_hi)."""
    hi = n_rhs if rhs_hi is None else rhs_hi
    lhs = rng.integers(0, n_lhs, n)
    rhs = rhs_lo + (lhs * 3 + rng.integers(0, 2, n)) % (hi - rhs_lo)
    return lhs, np.full(n, rel), rhs


def save_config(root: Path, cfg: ConfigSchema) -> Path:
    """``cfg`` as ``root/config.json`` (what ``bigembed train`` / ``launch`` read)."""
    path = root / "config.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path
