"""The importer end to end: round trips, partitions, shuffling, formats, relation modes."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bigembed.datasets import fb15k237_files
from bigembed.storage import EdgeStore, EntityStore
from support.imports import do_import, leftovers, random_edges, read_back, write_config, write_tsv


def test_round_trip_every_edge_once_in_its_bucket(tmp_path: Path) -> None:
    rels = ["likes", "knows", "owns"]
    rows = random_edges(3000, 300, rels, weights=True)
    config = write_config(
        tmp_path, entities={"node": 3}, relations=[(r, "node", "node") for r in rels]
    )
    cfg, summary = do_import(
        config, [write_tsv(tmp_path / "in.tsv", rows)], columns=_cols(weight=3), run_edges=500
    )
    expected = Counter((a, r, b, float(w)) for a, r, b, w in rows)
    assert read_back(cfg) == expected
    assert summary.total_edges == 3000
    entities = EntityStore(cfg.entity_path)
    assert entities.relation_names() == rels
    assert sum(entities.counts("node")) == len({r[0] for r in rows} | {r[2] for r in rows})
    # bucket (i, j) holds exactly the edges whose lhs is in partition i and rhs in j
    store = EdgeStore(cfg.edge_paths[0])
    for i, j in store.buckets():
        chunk = store.load_bucket(i, j)
        assert chunk.lhs.dtype == np.int32 and chunk.weight is not None
        assert chunk.weight.dtype == np.float32
        if len(chunk):
            assert chunk.lhs.max() < entities.count("node", i)
            assert chunk.rhs.max() < entities.count("node", j)
    weights = {w for *_, w in read_back(cfg)}
    assert weights == {0.25, 1.5, 2.0, 0.125}  # not truncated to integers (PBG's bug)
    assert leftovers(tmp_path) == []


def _cols(**kw):
    from bigembed.edgelists.inputs import ColumnSpec

    return ColumnSpec(**kw)


def _partition_of_names(cfg) -> dict[str, tuple[int, int]]:
    store = EntityStore(cfg.entity_path)
    out = {}
    for t in store.entity_types:
        for p in range(store.num_partitions(t)):
            for off, name in enumerate(store.names(t, p)):
                out[name] = (p, off)
    return out


def test_partition_assignment_is_deterministic_per_seed(tmp_path: Path) -> None:
    rows = random_edges(2000, 400, ["r"])
    results = []
    for k, (seed, order) in enumerate([(1, rows), (1, rows[::-1]), (2, rows)]):
        d = tmp_path / str(k)
        d.mkdir()
        config = write_config(d, entities={"node": 4}, seed=seed)
        cfg, _ = do_import(config, [write_tsv(d / "in.tsv", order)])
        results.append(_partition_of_names(cfg))
    assert results[0] == results[1]  # same seed, input order does not matter
    assert results[0] != results[2]  # another seed, another assignment
    counts = Counter(p for p, _ in results[0].values())
    assert sorted(counts.values()) == [100, 100, 100, 100]


def test_edges_are_shuffled_within_buckets(tmp_path: Path) -> None:
    # one partition, edges in file order e0->e1, e1->e2, ...: stored order must differ
    rows = [(f"e{i:05d}", "r", f"e{i + 1:05d}") for i in range(5000)]
    config = write_config(tmp_path, entities={"node": 1})
    cfg, _ = do_import(config, [write_tsv(tmp_path / "in.tsv", rows)], run_edges=1000)
    names = EntityStore(cfg.entity_path).names("node", 0)
    chunk = EdgeStore(cfg.edge_paths[0]).load_bucket(0, 0)
    stored = [names[i] for i in chunk.lhs]
    assert stored != [r[0] for r in rows]
    assert sorted(stored) == [r[0] for r in rows]
    # no long runs of consecutive file order survive
    positions = np.array([int(s[1:]) for s in stored])
    assert np.mean(np.diff(positions) == 1) < 0.01
    assert read_back(cfg) == Counter(rows)


def test_parquet_and_csv_inputs_with_named_columns(tmp_path: Path) -> None:
    rows = random_edges(500, 50, ["a", "b"], weights=True)
    config = write_config(tmp_path, relations=[("a", "node", "node"), ("b", "node", "node")])
    table = pa.table(
        {
            "src": [r[0] for r in rows],
            "w": [float(r[3]) for r in rows],
            "dst": [r[2] for r in rows],
            "kind": pa.array([r[1] for r in rows]).dictionary_encode(),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=100)
    spec = _cols(lhs="src", rel="kind", rhs="dst", weight="w")
    cfg, _ = do_import(config, [tmp_path / "in.parquet"], columns=spec)
    expected = Counter((a, r, b, float(w)) for a, r, b, w in rows)
    assert read_back(cfg) == expected

    csv_rows = [(f'"{a}, x"', f'"{w}"', r, b) for a, r, b, w in rows]
    csv = write_tsv(tmp_path / "in.csv.gz", [], sep=",")
    body = "head,weight,rel,tail\n" + "\n".join(",".join(r) for r in csv_rows) + "\n"
    csv.write_bytes(gzip.compress(body.encode()))
    spec = _cols(lhs="head", rel="rel", rhs="tail", weight="weight")
    from bigembed.edgelists.inputs import TextOptions

    cfg, _ = do_import(config, [csv], columns=spec, text=TextOptions(header=True), force=True)
    expected = Counter((f"{a}, x", r, b, float(w)) for a, r, b, w in rows)
    assert read_back(cfg) == expected


def test_non_dynamic_relations_route_entity_types(tmp_path: Path) -> None:
    rows = [
        ("u1", "likes", "i1"),
        ("u2", "likes", "i2"),
        ("u1", "follows", "u2"),
        ("i1", "similar", "i2"),
    ]
    rows += [("u1", "follows", "x")]  # 'x' is a user here
    config = write_config(
        tmp_path,
        entities={"user": 2, "item": 1},
        relations=[
            ("likes", "user", "item"),
            ("follows", "user", "user"),
            ("similar", "item", "item"),
        ],
    )
    cfg, summary = do_import(config, [write_tsv(tmp_path / "in.tsv", rows)])
    store = EntityStore(cfg.entity_path)
    users = {n for p in range(2) for n in store.names("user", p)}
    items = set(store.names("item", 0))
    assert users == {"u1", "u2", "x"} and items == {"i1", "i2"}
    assert summary.entities == {"user": 3, "item": 2}
    assert read_back(cfg) == Counter(rows)
    edges = EdgeStore(cfg.edge_paths[0])
    assert (edges.lhs_partitions, edges.rhs_partitions) == (2, 2)


def test_dynamic_relations_and_no_relation_column(tmp_path: Path) -> None:
    rows = random_edges(400, 40, ["z", "y", "x"])
    config = write_config(tmp_path, dynamic=True, relations=[("all", "node", "node")])
    cfg, summary = do_import(config, [write_tsv(tmp_path / "in.tsv", rows)])
    assert EntityStore(cfg.entity_path).relation_names() == ["x", "y", "z"]  # sorted
    assert (Path(cfg.entity_path) / "dynamic_rel_count.txt").read_text().strip() == "3"
    assert summary.relations == 3 and read_back(cfg) == Counter(rows)

    pairs = [(a, b) for a, _, b in rows]
    cfg, _ = do_import(
        config,
        [write_tsv(tmp_path / "pairs.tsv", pairs)],
        columns=_cols(rel=None, rhs=1),
        force=True,
    )
    assert EntityStore(cfg.entity_path).relation_names() == ["all"]
    assert read_back(cfg) == Counter((a, "all", b) for a, b in pairs)


def test_min_count_filters(tmp_path: Path) -> None:
    rows = [("a", "r1", "b")] * 3 + [("a", "r2", "c")] + [("b", "r1", "a")] * 2 + [("d", "r1", "a")]
    config = write_config(tmp_path, dynamic=True, relations=[("all", "node", "node")])
    cfg, summary = do_import(
        config,
        [write_tsv(tmp_path / "in.tsv", rows)],
        entity_min_count=2,
        relation_type_min_count=2,
    )
    store = EntityStore(cfg.entity_path)
    assert store.relation_names() == ["r1"]
    assert sorted(store.names("node", 0) + store.names("node", 1)) == ["a", "b"]
    assert read_back(cfg) == Counter({("a", "r1", "b"): 3, ("b", "r1", "a"): 2})
    assert summary.dropped_relations == ["r2"]
    assert summary.dropped_entities == {"node": 2}  # c (only in r2 edges, recounted) and d
    assert summary.inputs[0].dropped_min_count == 2
    text = summary.format()
    assert (
        "dropped by --entity-min-count" in text and "dropped by --relation-type-min-count" in text
    )


def test_fb15k237_three_edge_paths_share_one_dictionary(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        entities={"all": 1},
        relations=[("all_edges", "all", "all")],
        dynamic=True,
        edge_paths=["train", "valid", "test"],
    )
    files = fb15k237_files()
    inputs = [files[s] for s in ("train", "valid", "test")]
    cfg, summary = do_import(config, inputs)
    names = set()
    rels = set()
    sizes = []
    for path in inputs:
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        sizes.append(len(lines))
        for line in lines:
            h, r, t = line.split("\t")
            names.update((h, t))
            rels.add(r)
    assert summary.entities == {"all": len(names)} == {"all": 14541}
    assert summary.relations == len(rels) == 237
    assert [r.edges for r in summary.inputs] == sizes
    for k, path in enumerate(cfg.edge_paths):
        assert EdgeStore(path).total_edges == sizes[k]
    assert summary.seconds < 20


def test_tiny_buffers_force_many_flushes_runs_and_splits(tmp_path: Path) -> None:
    rows = random_edges(4000, 700, ["a", "b"], weights=True)
    config = write_config(
        tmp_path,
        entities={"user": 3, "item": 1},
        relations=[("a", "user", "item"), ("b", "item", "user")],
    )
    from bigembed.edgelists.inputs import TextOptions

    cfg, summary = do_import(
        config,
        [write_tsv(tmp_path / "in.tsv", rows)],
        columns=_cols(weight=3),
        text=TextOptions(block_size=4096),
        buffer_edges=64,
        run_edges=100,
    )
    assert read_back(cfg) == Counter((a, r, b, float(w)) for a, r, b, w in rows)
    assert summary.total_edges == 4000
    edges = EdgeStore(cfg.edge_paths[0])
    assert (edges.lhs_partitions, edges.rhs_partitions) == (3, 3)
    # items are unpartitioned (partition 0): every edge has a 0 on its item side
    assert sum(edges.num_edges(i, j) for i, j in edges.buckets()) == 4000
    assert all(edges.num_edges(i, j) == 0 for i, j in edges.buckets() if i and j)
    assert leftovers(tmp_path) == []


def test_edge_paths_inside_entity_path_like_pbg(tmp_path: Path) -> None:
    rows = random_edges(300, 30, ["r"])
    config = tmp_path / "c.yaml"
    base = write_config(tmp_path)
    import yaml

    data = yaml.safe_load(base.read_text())
    data["entity_path"] = str(tmp_path / "fb")
    data["edge_paths"] = [str(tmp_path / "fb" / "train_partitioned")]
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "fb").mkdir()
    raw = write_tsv(tmp_path / "fb" / "train.txt", rows)  # raw data lives in entity_path
    cfg, _ = do_import(config, [raw])
    assert read_back(cfg) == Counter(rows)
    assert sorted(p.name for p in (tmp_path / "fb").iterdir())[-3:] == [
        "manifest.json",
        "train.txt",
        "train_partitioned",
    ]
    assert leftovers(tmp_path) == []


@pytest.mark.integration
def test_cli_subprocess_exit_codes(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = write_config(tmp_path)
    good = write_tsv(tmp_path / "in.tsv", [("a", "r", "b")])
    cmd = [sys.executable, "-m", "bigembed.cli", "import", str(config)]
    ok = subprocess.run([*cmd, str(good)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and "edges" in ok.stdout and "entities node: 2" in ok.stdout
    bad = subprocess.run(
        [*cmd, str(tmp_path / "nope.tsv")], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "nope.tsv: input file not found" in bad.stderr
    assert "Traceback" not in bad.stderr
