"""Entity/edge store readers: chunking, memory-mapped ranges, corrupt and missing stores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bigembed.errors import InputError
from bigembed.importing.npyfile import AppendableNpy
from bigembed.storage import EdgeStore, EntityStore, chunk_range
from bigembed.storage.edges import write_edge_manifest
from bigembed.storage.entities import write_entity_store


def test_chunk_range_follows_pbg_rule() -> None:
    assert [chunk_range(10, c, 3) for c in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [chunk_range(2, c, 4) for c in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_range(0, 0, 1) == (0, 0)
    with pytest.raises(ValueError):
        chunk_range(5, 3, 3)


def test_appendable_npy_is_a_standard_npy(tmp_path: Path) -> None:
    f = AppendableNpy(tmp_path / "a.npy", np.dtype(np.int32))
    f.append(np.arange(5))
    f.append(np.arange(3))
    f.finish()
    assert np.load(tmp_path / "a.npy").tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert np.load(tmp_path / "a.npy", mmap_mode="r")[3:6].tolist() == [3, 4, 0]


def _edge_store(tmp_path: Path, n: int = 11) -> Path:
    path = tmp_path / "edges"
    (path / "bucket_0_1").mkdir(parents=True)
    for name, values in {
        "lhs": np.arange(n, dtype=np.int32),
        "rhs": np.arange(n, dtype=np.int32) * 2,
        "rel": np.zeros(n, dtype=np.int32),
        "weight": np.full(n, 0.25, dtype=np.float32),
    }.items():
        np.save(path / "bucket_0_1" / f"{name}.npy", values)
    counts = np.zeros((2, 2), dtype=np.int64)
    counts[0, 1] = n
    dtypes = {c: np.dtype(np.int32) for c in ("lhs", "rhs", "rel")} | {
        "weight": np.dtype(np.float32)
    }
    write_edge_manifest(path, bucket_counts=counts, dtypes=dtypes, has_weights=True)
    return path


def test_chunks_cover_bucket_exactly_once(tmp_path: Path) -> None:
    store = EdgeStore(_edge_store(tmp_path))
    assert store.buckets() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert store.total_edges == 11 and store.num_edges(0, 1) == 11 and store.num_edges(1, 1) == 0
    whole = store.load_bucket(0, 1)
    for num_chunks in (1, 2, 3, 4, 11, 20):
        parts = [store.load_chunk(0, 1, c, num_chunks) for c in range(num_chunks)]
        assert np.concatenate([p.lhs for p in parts]).tolist() == whole.lhs.tolist()
        assert np.concatenate([p.rhs for p in parts]).tolist() == whole.rhs.tolist()
        assert np.concatenate([p.weight for p in parts]).tolist() == [0.25] * 11
    empty = store.load_chunk(1, 1, 0, 2)
    assert len(empty) == 0 and empty.lhs.dtype == np.int32


def test_missing_and_corrupt_stores_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nowhere"):
        EdgeStore(tmp_path / "nowhere")
    path = _edge_store(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = 99
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="format_version 99"):
        EdgeStore(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="corrupt manifest"):
        EdgeStore(path)
    (path / "manifest.json").unlink()
    with pytest.raises(InputError, match=r"manifest\.json: missing"):
        EdgeStore(path)


def test_truncated_bucket_file_is_reported(tmp_path: Path) -> None:
    path = _edge_store(tmp_path)
    np.save(path / "bucket_0_1" / "lhs.npy", np.arange(5, dtype=np.int32))
    with pytest.raises(InputError, match=r"lhs\.npy"):
        EdgeStore(path).load_bucket(0, 1)


def test_entity_store_round_trip(tmp_path: Path) -> None:
    write_entity_store(
        tmp_path / "ent",
        names={
            "user": [pa.array(["a", "b"]), pa.array(["c"])],
            "item": [pa.array([], pa.string())],
        },
        relation_names=["likes"],
        dynamic_relations=False,
        seed=3,
    )
    store = EntityStore(tmp_path / "ent")
    assert store.entity_types == ["user", "item"]
    assert store.num_partitions("user") == 2 and store.count("user", 1) == 1
    assert store.names("user", 0) == ["a", "b"] and store.names("item", 0) == []
    assert store.relation_names() == ["likes"] and store.num_relations == 1
    assert (tmp_path / "ent" / "entity_count_user_1.txt").read_text().strip() == "1"
    assert (tmp_path / "ent" / "dynamic_rel_count.txt").read_text().strip() == "1"
    assert store.offset_of("user", "c") == (1, 0) and store.offset_of("user", "zz") is None
    parts, offsets = store.lookup("user", ["b", "nope", "c"])
    assert parts.tolist() == [0, -1, 1] and offsets.tolist() == [1, -1, 0]
    assert store.name_to_offset("user", 0) == {"a": 0, "b": 1}
    with pytest.raises(InputError, match=r"no entity type 'x'"):
        store.num_partitions("x")
    (tmp_path / "ent" / "entity_names_user_0.parquet").unlink()
    with pytest.raises(InputError, match=r"entity_names_user_0\.parquet"):
        EntityStore(tmp_path / "ent").names("user", 0)


def test_atomic_writes_get_ordinary_file_permissions(tmp_path: Path) -> None:
    """Outputs are readable like any file the user creates (mkstemp alone would make 0600)."""
    import os

    from bigembed.atomic import FILE_MODE, atomic_file, atomic_write_text

    atomic_write_text(tmp_path / "a.json", "{}")
    with atomic_file(tmp_path / "b.npy") as tmp:
        tmp.write_bytes(b"x")
    for name in ("a.json", "b.npy"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == FILE_MODE
    assert FILE_MODE & 0o400  # the owner can always read
