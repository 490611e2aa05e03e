"""Featurized types that are partitioned, or trained by several machines: one feature table,
shared by all the type's partitions, resident like an unpartitioned type's table, stored once
in the checkpoint and kept in step across trainers like the other shared parameters."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import bigembed
from bigembed.buckets import Batch, negative_settings
from bigembed.checkpoints import CheckpointStore
from bigembed.cli import main
from bigembed.config import model_spec, parse_config_dict
from bigembed.distributed.replica_sync import ReplicaSync
from bigembed.kernels import BatchTrainer, Table
from bigembed.model import FeatureBags, ScoringModel
from bigembed.storage import FEATURES_KEY, FeatureCSR, write_feature_names, write_features
from bigembed.train import ModelState
from bigembed.train.memory.partitions import PartitionStore, init_embeddings
from support.featurized_graphs import write_featurized_graph
from support.graphs import graph_config, save_config, write_buckets
from support.ranks import TIMEOUT, check_events, read_events, run

USERS, ITEMS, CATEGORIES = 24, 32, 4


def import_and_train(root: Path, *extra: str) -> None:
    args = ["import", str(root / "config.yaml"), str(root / "edges.tsv"), "--no-progress"]
    args += ["--lhs-col", "0", "--rel-col", "1", "--rhs-col", "2"]
    assert main([*args, "--features", f"item={root / 'features.tsv'}"]) == 0
    assert main(["train", str(root / "config.yaml"), "--no-progress", *extra]) == 0


def test_a_partitioned_featurized_type_shares_one_feature_table(tmp_path: Path) -> None:
    """Users (2 partitions) like the items (2 partitions, featurized) of one category: each
    user's top items are of its category, items held out of the graph land among theirs from
    their features alone, the checkpoint holds one feature table, and export and query see
    every item of both partitions."""
    g = write_featurized_graph(
        tmp_path,
        users=USERS,
        items=ITEMS,
        categories=CATEGORIES,
        edges=900,
        held_out=4,
        num_epochs=4,
        eval_fraction=0.05,  # the withheld-edge eval ranks each item partition's bag means
        entities={
            "user": {"num_partitions": 2},
            "item": {"num_partitions": 2, "featurized": True},
        },
    )
    import_and_train(tmp_path)
    model = bigembed.load(tmp_path / "model")
    cat, fav = g["cat"], g["fav"]
    hits = [
        np.mean([cat[int(p.name[2:])] == fav[u] for p in model.predict(f"u{u}", "likes", k=5)])
        for u in range(USERS)
    ]
    assert np.mean(hits) > 0.9  # as unpartitioned (test_featurized.py)
    for n in range(ITEMS, ITEMS + 4):  # held out of the graph entirely
        near = model.similar(model.embed([f"c{cat[n]}", f"i{n}"]), type="item", k=5)
        assert all(cat[int(p.name[2:])] == cat[n] for p in near)

    # one feature table (partition 0), every feature a row; both partitions' items known
    store = CheckpointStore(tmp_path / "model")
    version = store.committed_version()
    features = model.store.feature_names("item")
    assert store.has_partition("item", 0, version)
    assert not store.has_partition("item", 1, version)
    assert np.asarray(model.trained.feature_rows("item")).shape == (len(features), 8)
    assert model.num_entities("item") == ITEMS
    assert all(model.store.count("item", p) > 0 for p in (0, 1))
    ids = {name: f for f, name in enumerate(features)}
    rows = np.asarray(model.trained.feature_rows("item"))
    rows = rows + model.model.global_embs["item"].detach().numpy()
    for n in (0, 1, ITEMS - 1):  # items of either partition: the mean of their features' rows
        mean = (rows[ids[f"c{cat[n]}"]] + rows[ids[f"i{n}"]]) / 2
        assert np.allclose(model.vector(f"it{n}", type="item"), mean, atol=1e-5)

    report = tmp_path / "eval.json"
    args = ["eval", str(tmp_path / "config.yaml"), "--no-progress", "--output", str(report)]
    assert main(args) == 0
    assert json.loads(report.read_text())["overall"]["filtered"]["mrr"] > 0.3

    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "model"), "--format", "tsv", "-o", str(out)]) == 0
    exported = {}
    for line in (out / "entities.tsv").read_text().splitlines():
        name, *values = line.split("\t")
        if name.startswith("it"):
            exported[name] = np.array(values, dtype=np.float32)
    assert sorted(exported) == sorted(f"it{n}" for n in range(ITEMS))
    assert np.allclose(exported["it3"], model.vector("it3", type="item"), atol=1e-5)


def test_the_partitions_of_a_featurized_type_are_views_of_one_resident_table(
    tmp_path: Path,
) -> None:
    """In the partition store a featurized type's partitions are its one feature table (pinned,
    read once, written once) with each partition's own bags; plain types swap as usual."""
    counts = {("item", 0): 5, ("user", 0): 3, ("user", 1): 4}
    store = PartitionStore(
        counts,
        {"item": 2, "user": 2},
        CheckpointStore(tmp_path / "ck"),
        committed=0,
        working=1,
        init_source=None,
        init_scale=0.1,
        seed=0,
        shared=False,
        pinned=[("item", 0)],
    )
    bags = {
        ("item", 0): FeatureBags.from_lists([[0, 1]]),
        ("item", 1): FeatureBags.from_lists([[2], [3, 4]]),
    }
    store.bags = bags
    first = store.ensure({("user", 0), ("item", 1)})
    assert first[("item", 1)].emb is first[("item", 0)].emb
    assert first[("item", 1)].bags is bags[("item", 1)]
    assert first[("item", 0)].bags is bags[("item", 0)]
    first[("item", 1)].emb[3] += 1.0  # a feature row trained through partition 1
    second = store.ensure({("user", 1), ("item", 0), ("item", 1)})
    assert second[("item", 1)] is first[("item", 1)]  # one view object: sent to workers once
    assert set(store.loaded) == {("item", 0), ("user", 1)}
    store.flush()
    ck = CheckpointStore(tmp_path / "ck")
    assert not ck.has_partition("item", 1, 1)
    emb, state = torch.empty(5, 2), torch.empty(5)
    ck.load_partition("item", 0, 1, emb, state)
    start = init_embeddings(5, 2, 0.1, 0, "item", 0)
    assert torch.allclose(emb[3], start[3] + 1.0)
    store.release_all()


# ---------------------------------------------------------------------- distributed
PER_PART_USERS, PER_PART_ITEMS, PER_PART_CATS, DIM = 60, 40, 4, 16


def write_split_graph(root: Path, seed: int = 0) -> dict[int, np.ndarray]:
    """Users and items in 2 partitions; users of partition p like items of partition p only
    (buckets (0, 0) and (1, 1)), and the items of partition p have features of their own:
    a category ``p:c{k}`` and an id. Returns, per partition, the feature ids its items use."""
    rng = np.random.default_rng(seed)
    buckets = {}
    csrs, feats_of = [], {}
    next_id = 2 * PER_PART_CATS  # categories first: p * PER_PART_CATS + k
    for p in (0, 1):
        cat = rng.integers(0, PER_PART_CATS, PER_PART_ITEMS)
        fav = rng.integers(0, PER_PART_CATS, PER_PART_USERS)
        lhs = rng.integers(0, PER_PART_USERS, 3000)
        rhs = np.array([rng.choice(np.flatnonzero(cat == fav[u])) for u in lhs])
        buckets[(p, p)] = (lhs, np.zeros(len(lhs), np.int64), rhs)
        ids = np.arange(next_id, next_id + PER_PART_ITEMS)
        next_id += PER_PART_ITEMS
        bags = [[p * PER_PART_CATS + int(cat[k]), int(ids[k])] for k in range(PER_PART_ITEMS)]
        b = FeatureBags.from_lists(bags)
        csrs.append(FeatureCSR(b.offsets.numpy(), b.features.numpy(), b.weights.numpy()))
        feats_of[p] = np.concatenate((p * PER_PART_CATS + np.arange(PER_PART_CATS), ids))
    write_buckets(
        root,
        {"user": [PER_PART_USERS] * 2, "item": [PER_PART_ITEMS] * 2},
        ["likes"],
        False,
        buckets,
        (2, 2),
    )
    entities = root / "entities"
    for p, csr in enumerate(csrs):
        write_features(entities, "item", p, csr)
    write_feature_names(entities, "item", pa.array([f"feature{f}" for f in range(next_id)]))
    manifest = json.loads((entities / "manifest.json").read_text())
    manifest[FEATURES_KEY] = {"item": {"num_features": next_id}}
    (entities / "manifest.json").write_text(json.dumps(manifest))
    return feats_of


@pytest.mark.integration
def test_the_feature_table_reaches_the_checkpoint_from_both_trainers(tmp_path: Path) -> None:
    """Two trainers on 127.0.0.1. The features of partition p's items are trained only in
    bucket (p, p); both buckets run side by side (items are not locked: their partitions
    hold no parameters). In rank 0's checkpoint the feature rows of the bucket only rank 1
    trained must have moved, Adagrad state included: they reach rank 0 only through the
    shared-parameter exchange, which must therefore carry the feature table."""
    feats_of = write_split_graph(tmp_path)
    base = graph_config(
        tmp_path,
        entities={
            "user": {"num_partitions": 2},
            "item": {"num_partitions": 2, "featurized": True},
        },
        relations=[{"name": "likes", "lhs": "user", "rhs": "item", "operator": "none"}],
        dynamic_relations=False,
        num_epochs=1,
        dimension=DIM,
        distributed_timeout=TIMEOUT,
    )
    by_part: dict[int, set[int]] = defaultdict(set)
    for attempt in range(3):  # which trainer gets which bucket is up to the lock server
        cfg = base.model_copy(update={"checkpoint_path": str(tmp_path / f"m{attempt}")})
        out = run(["launch", str(save_config(tmp_path, cfg)), "-n", "2"])
        assert out.returncode == 0, out.stdout + out.stderr
        granted = check_events(read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl"))
        assert sorted(granted[0]) == [(0, 0), (1, 1)]
        by_part = defaultdict(set)
        for r in CheckpointStore(cfg.checkpoint_path).read_stats():
            if r["type"] == "bucket":
                by_part[r["lhs_partition"]].add(r["trainer"])
        foreign = [p for p in (0, 1) if 0 not in by_part[p]]
        if foreign:
            break
    assert foreign, f"rank 0 trained both buckets 3 times: nothing proven ({dict(by_part)})"

    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    assert not store.has_partition("item", 1, version)  # one feature table
    rows = sum(len(f) for f in feats_of.values())
    emb, state = torch.empty(rows, DIM), torch.empty(rows)
    store.load_partition("item", 0, version, emb, state)
    start = init_embeddings(rows, DIM, cfg.init_scale, cfg.seed, "item", 0)
    for p in (0, 1):
        f = torch.from_numpy(feats_of[p])
        moved = (emb[f] - start[f]).abs().amax(dim=1)
        assert float((moved > 1e-4).float().mean()) > 0.9, (p, by_part[p])
        assert float((state[f] > 0).float().mean()) > 0.9, (p, by_part[p])
    model = bigembed.load(cfg.checkpoint_path)
    assert model.num_entities("item") == 2 * PER_PART_ITEMS


@pytest.mark.parametrize(
    ("parts", "overrides"),
    [
        ((2, 2), {"num_uniform_negs": 0}),  # same-batch negatives only
        ((2, 2), {"operator": "translation", "loss_fn": "ranking", "comparator": "l2"}),
        ((1, 2), {"all_negs": True, "operator": "diagonal", "comparator": "cos"}),
        ((2, 1), {"loss_fn": "logistic", "operator": "complex_diagonal"}),
        pytest.param(  # Hogwild workers: each is sent the views of the one feature table
            (2, 2), {"workers": 2}, marks=pytest.mark.integration, id="workers"
        ),
    ],
)
def test_every_negative_mode_operator_and_loss_trains_partitioned(
    tmp_path: Path, parts: tuple[int, int], overrides: dict[str, Any]
) -> None:
    """(user, item) partition counts with a featurized item type, in each negative mode and
    with other operators, comparators and losses: each user's top items are mostly of its
    category (chance: 1 in 4)."""
    relation = {"name": "likes", "lhs": "user", "rhs": "item", "operator": "none"}
    for key in ("operator", "all_negs"):
        if key in overrides:
            relation[key] = overrides.pop(key)
    g = write_featurized_graph(
        tmp_path,
        users=USERS,
        items=ITEMS,
        categories=CATEGORIES,
        edges=600,
        num_epochs=3,
        entities={
            "user": {"num_partitions": parts[0]},
            "item": {"num_partitions": parts[1], "featurized": True},
        },
        relations=[relation],
        **overrides,
    )
    import_and_train(tmp_path)
    model = bigembed.load(tmp_path / "model")
    cat, fav = g["cat"], g["fav"]
    hits = [
        np.mean([cat[int(p.name[2:])] == fav[u] for p in model.predict(f"u{u}", "likes", k=5)])
        for u in range(USERS)
    ]
    assert np.mean(hits) > 0.6, np.mean(hits)


def test_data_parallel_replicas_exchange_a_shared_feature_table_once(tmp_path: Path) -> None:
    """A data-parallel bucket's tables name the feature table once per partition of the
    featurized type; the replicas' exchange must carry it once (twice would add each change
    twice)."""
    cfg = graph_config(tmp_path)
    model = ScoringModel(model_spec(cfg, 1))
    state_ = ModelState(model, [torch.zeros_like(p) for p in model.parameters()])
    sync = ReplicaSync(SimpleNamespace(cfg=cfg), state_)  # type: ignore[arg-type]
    emb, state = torch.zeros(5, 2), torch.zeros(5)
    tables = {
        ("item", 0): Table(emb, state, FeatureBags.from_lists([[0, 1]])),
        ("item", 1): Table(emb, state, FeatureBags.from_lists([[2], [3, 4]])),
        ("user", 0): Table(torch.zeros(3, 2), torch.zeros(3)),
    }
    shared = sync.shared_tensors(tables)
    assert sum(t is emb for t in shared.tensors) == 1
    assert sum(t is state for t in shared.tensors) == 1
    assert len(shared.tensors) == len(sync._model_tensors()[1]) + 4


@pytest.mark.parametrize("all_negs", [False, True])
def test_two_partitions_of_a_featurized_type_in_one_bucket_update_their_own_features(
    all_negs: bool,
) -> None:
    """A relation item -> item, bucket (0, 1): both sides are views of the one feature table
    with different bags. The step must update the table as if each side had its own copy
    (the two partitions' features are disjoint here), never add the two sides' entity-row
    gradients row by row as it does for one partition on both sides."""
    data = {
        "entities": {"item": {"num_partitions": 2, "featurized": True}},
        "relations": [
            {"name": "like", "lhs": "item", "rhs": "item", "operator": "none", "all_negs": all_negs}
        ],
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "m",
        "dimension": 3,
        "comparator": "dot",
        "loss_fn": "softmax",
        "batch_size": 4,
        "num_batch_negs": 2,
        "num_uniform_negs": 2,
    }
    cfg = parse_config_dict(data)
    torch.manual_seed(0)
    model = ScoringModel(model_spec(cfg))
    feat = torch.randn(6, 3)
    bags0 = FeatureBags.from_lists([[0, 1], [2], [1, 2], [0]])  # features 0-2
    bags1 = FeatureBags.from_lists([[3], [4, 5], [5], [3, 4]])  # features 3-5
    batch = Batch(
        torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2]), torch.zeros(4).long(), 0, None
    )

    def step(lhs: Table, rhs: Table) -> None:
        trainer = BatchTrainer(
            model,
            [torch.zeros_like(p) for p in model.parameters()],
            negative_settings(cfg),
            0.1,
            0.0,
            torch.Generator().manual_seed(3),
        )
        trainer.step(batch, lhs, rhs)

    shared, state = feat.clone(), torch.zeros(6)
    step(Table(shared, state, bags0), Table(shared, state, bags1))
    own0, own1 = feat.clone(), feat.clone()
    state0, state1 = torch.zeros(6), torch.zeros(6)
    step(Table(own0, state0, bags0), Table(own1, state1, bags1))
    assert not torch.equal(shared, feat)
    assert torch.allclose(shared[:3], own0[:3], atol=1e-6)
    assert torch.allclose(shared[3:], own1[3:], atol=1e-6)
    assert torch.allclose(state[:3], state0[:3]) and torch.allclose(state[3:], state1[3:])
