"""Tiny graphs and checkpoints for the eval / export / query / interop tests.

* :func:`write_graph` writes an entity store and edge paths from named edges (no importer);
* :func:`write_checkpoint` writes a checkpoint with hand-chosen embeddings, so ranks are known;
* :func:`trained_graph` trains a tiny model on a memorisable graph (about a second);
  :func:`trained_ring` with its defaults is the ``trained_checkpoint`` fixture.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from bigembed.atomic import atomic_write_text
from bigembed.checkpoints import VERSION_FILE, CheckpointStore
from bigembed.checkpoints.metadata import CheckpointMetadata, IterationPosition
from bigembed.config import ConfigSchema, config_to_dict, model_spec, parse_config_dict
from bigembed.model.scoring import ScoringModel
from bigembed.storage.edges import write_edge_manifest
from bigembed.storage.entities import write_entity_store
from bigembed.storage.format import bucket_dir

Edge = tuple[str, str, str]


def write_graph(
    root: Path,
    partitions: dict[str, list[list[str]]],
    relations: Sequence[str],
    edge_sets: dict[str, Sequence[Edge]],
    *,
    dynamic: bool,
    rel_types: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Path]:
    """Entity store ``root/entities`` and one edge path ``root/<set>`` per edge set.

    ``partitions[type][p]`` lists the names of partition ``p`` in offset order.
    ``rel_types[relation] = (lhs type, rhs type)``; default: the only type, both sides.
    """
    write_entity_store(
        root / "entities",
        names={t: [pa.array(p, pa.string()) for p in parts] for t, parts in partitions.items()},
        relation_names=list(relations),
        dynamic_relations=dynamic,
        seed=0,
    )
    where = {
        t: {n: (p, o) for p, names in enumerate(parts) for o, n in enumerate(names)}
        for t, parts in partitions.items()
    }
    only = next(iter(partitions))
    rel_types = rel_types or {r: (only, only) for r in relations}
    rel_ids = {r: i for i, r in enumerate(relations)}
    nl = max(len(partitions[lt]) for lt, _ in rel_types.values())
    nr = max(len(partitions[rt]) for _, rt in rel_types.values())
    paths = {}
    for name, edges in edge_sets.items():
        edir = root / name
        cols: dict[tuple[int, int], list[list[int]]] = {}
        for h, r, t in edges:
            lt, rt = rel_types[r]
            (lp, lo), (rp, ro) = where[lt][h], where[rt][t]
            cols.setdefault((lp, rp), [[], [], []])
            for col, v in zip(cols[(lp, rp)], (lo, ro, rel_ids[r]), strict=True):
                col.append(v)
        counts = np.zeros((nl, nr), np.int64)
        for (i, j), (lhs, rhs, rel) in cols.items():
            d = edir / bucket_dir(i, j)
            d.mkdir(parents=True, exist_ok=True)
            np.save(d / "lhs.npy", np.array(lhs, np.int32))
            np.save(d / "rhs.npy", np.array(rhs, np.int32))
            np.save(d / "rel.npy", np.array(rel, np.int32))
            counts[i, j] = len(lhs)
        edir.mkdir(parents=True, exist_ok=True)
        dtypes = {k: np.dtype(np.int32) for k in ("lhs", "rhs", "rel")}
        write_edge_manifest(edir, bucket_counts=counts, dtypes=dtypes, has_weights=False)
        paths[name] = edir
    return paths


def make_config(root: Path, **overrides: Any) -> ConfigSchema:
    data: dict[str, Any] = {
        "entities": {"node": {"num_partitions": 1}},
        "relations": [{"name": "all", "lhs": "node", "rhs": "node", "operator": "none"}],
        "dynamic_relations": False,
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "train")],
        "checkpoint_path": str(root / "model"),
        "dimension": 2,
        "global_emb": False,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 1,
        "batch_size": 50,
        "num_batch_negs": 10,
        "num_uniform_negs": 10,
        "lr": 0.1,
        "eval_fraction": 0.0,
        "workers": 1,
    }
    data.update(overrides)
    return parse_config_dict(data)


USER_ITEM_RELATIONS = {"buys": ("user", "item"), "follows": ("user", "user")}


def user_item_config(root: Path) -> ConfigSchema:
    """Two entity types (users in 2 partitions, items in 1), global embeddings, and a linear
    (user buys item) and a translation (user follows user) relation: standard mode."""
    return make_config(
        root,
        dimension=3,
        global_emb=True,
        entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
        relations=[
            {"name": "buys", "lhs": "user", "rhs": "item", "operator": "linear"},
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
        ],
    )


def write_config_file(cfg: ConfigSchema, path: Path) -> Path:
    path.write_text(json.dumps(config_to_dict(cfg), indent=1))
    return path


def write_checkpoint(
    cfg: ConfigSchema,
    embeddings: dict[tuple[str, int], np.ndarray],
    relation_names: Sequence[str],
    *,
    params: dict[str, torch.Tensor] | None = None,
    version: int = 1,
) -> ScoringModel:
    """A committed checkpoint at ``cfg.checkpoint_path`` with exactly these embeddings.

    Operator parameters start at their identity values; ``params`` overrides state-dict
    entries. Returns the model (with those parameters).
    """
    model = ScoringModel(model_spec(cfg, len(relation_names)))
    if params:
        state = model.state_dict()
        state.update(params)
        model.load_state_dict(state)
    store = CheckpointStore(cfg.checkpoint_path)
    for (etype, part), emb in embeddings.items():
        t = torch.from_numpy(np.asarray(emb, np.float32))
        store.save_partition(etype, part, version, t, torch.zeros(t.shape[0]))
    store.save_model(version, {"model": model.state_dict(), "optimizer": None})
    store.write_metadata(
        CheckpointMetadata(
            version=version,
            config=config_to_dict(cfg),
            iteration=IterationPosition(num_edge_chunks=1),
            entity_counts={key: len(e) for key, e in embeddings.items()},
            num_relations=len(relation_names),
            relation_names=list(relation_names),
        )
    )
    atomic_write_text(Path(cfg.checkpoint_path) / VERSION_FILE, f"{version}\n")
    return model


def ring_graph(n: int = 12) -> tuple[list[str], list[Edge]]:
    """Names and edges of a small memorisable graph: two functional relations on a ring."""
    names = [f"n{i}" for i in range(n)]
    edges = [(names[i], "next", names[(i + 1) % n]) for i in range(n)]
    edges += [(names[i], "far", names[(i + 5) % n]) for i in range(n)]
    return names, edges


def trained_graph(
    root: Path, *, partitions: int = 1, repeat: int = 100, **overrides: Any
) -> tuple[ConfigSchema, list[Edge]]:
    """Train a tiny dynamic-relations model on :func:`ring_graph` (each edge ``repeat`` times)."""
    names, edges = ring_graph()
    parts = [names[p::partitions] for p in range(partitions)]
    write_graph(
        root,
        {"node": parts},
        ["far", "next"],
        {"train": edges * repeat, "test": edges},
        dynamic=True,
    )
    settings: dict[str, Any] = dict(
        entities={"node": {"num_partitions": partitions}},
        relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": "complex_diagonal"}],
        dynamic_relations=True,
        dimension=16,
        num_epochs=1,
        batch_size=60,
        num_batch_negs=10,
        num_uniform_negs=10,
        lr=0.2,
        init_scale=0.5,
        seed=1,
    )
    settings.update(overrides)
    cfg = make_config(root, **settings)
    from bigembed.train.single_machine import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: OpenMP threads only add waiting on a busy machine
    try:
        train(cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    return cfg, edges


class TrainedRing(NamedTuple):
    """What :func:`trained_ring` made: the folder, the config (and its file), the ring's edges."""

    root: Path
    config: ConfigSchema
    config_file: Path
    edges: list[Edge]


def trained_ring(root: Path) -> TrainedRing:
    """:func:`trained_graph` with its defaults under ``root``, the config also written as
    ``root/config.json`` (what the ``trained_checkpoint`` fixture gives)."""
    cfg, edges = trained_graph(root)
    return TrainedRing(root, cfg, write_config_file(cfg, root / "config.json"), edges)
