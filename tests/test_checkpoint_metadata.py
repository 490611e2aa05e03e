"""The checkpoint metadata record: one JSON form, read back exactly, validated in one place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bigembed.checkpoints.metadata import (
    CheckpointMetadata,
    IterationPosition,
    parse_partition_key,
)
from bigembed.checkpoints.reading import load_trained
from bigembed.checkpoints.store import CheckpointStore
from bigembed.errors import CheckpointError
from bigembed.train.records import parse_records
from bigembed.train.single_machine import train
from support.checkpoints import make_config, write_checkpoint
from support.graphs import graph_config, write_graph

# the keys docs/FORMAT.md lists for metadata.v{N}.json as training writes it
TRAINED_KEYS = {
    "format_version",
    "version",
    "time",
    "bigembed_version",
    "config",
    "iteration",
    "num_relations",
    "entity_counts",
    "relation_names",
    "import_id",
}
ITERATION_KEYS = {
    "num_epochs",
    "epoch_idx",
    "num_edge_paths",
    "edge_path_idx",
    "edge_path",
    "num_edge_chunks",
    "edge_chunk_idx",
}


def _record(**overrides) -> CheckpointMetadata:
    fields = {
        "version": 3,
        "config": {"relations": [{"name": "r"}], "entities": {"user_item": {}}},
        "iteration": IterationPosition(epoch_idx=1, num_epochs=2, edge_path="p"),
        "entity_counts": {("user_item", 0): 5, ("user_item", 12): 0, ("user_item_2", 0): 7},
        "num_relations": 1,
        "relation_names": ["r"],
        "import_id": "abc",
    }
    return CheckpointMetadata(**{**fields, **overrides})


def test_record_round_trips_through_its_json_form() -> None:
    record = _record()
    data = json.loads(json.dumps(record.to_json()))
    assert data["entity_counts"] == {"user_item_0": 5, "user_item_12": 0, "user_item_2_0": 7}
    assert data["iteration"] == {"epoch_idx": 1, "num_epochs": 2, "edge_path": "p"}
    assert CheckpointMetadata.from_json(data, "m.json") == record


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("user_item_3", ("user_item", 3)),
        ("a_b_10", ("a_b", 10)),
        ("node_0", ("node", 0)),
        ("node", None),
        ("_3", None),
        ("node_", None),
        ("node_3a", None),
        ("node_-1", None),
        ("node_\u0663", None),  # a non-ASCII digit
    ],
)
def test_partition_keys_split_at_the_last_underscore(
    text: str, key: tuple[str, int] | None
) -> None:
    assert parse_partition_key(text) == key


def test_trained_metadata_reads_back_to_the_same_json(tmp_path: Path) -> None:
    """What training writes has exactly the documented keys, and the record read from it writes
    back the same object: the on-disk form is unchanged by reading it through the record."""
    write_graph(tmp_path, num_partitions=2)
    cfg = graph_config(tmp_path, num_epochs=1, num_partitions=2)
    train(cfg, progress=False)
    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    raw = json.loads(store.metadata_path(version).read_text())
    assert set(raw) == TRAINED_KEYS and set(raw["iteration"]) == ITERATION_KEYS
    record = store.read_metadata(version)
    assert record.to_json() == raw
    assert record.version == version and record.entity_counts[("node", 1)] > 0
    assert record.iteration.num_edge_chunks is not None


def test_minimal_metadata_takes_defaults(tmp_path: Path) -> None:
    """A file without the optional keys (older writers, tools) reads with their defaults."""
    path = tmp_path / "metadata.v4.json"
    data = {"format_version": 1, "config": {"relations": [{}, {}]}, "iteration": {}}
    record = CheckpointMetadata.from_json(data, path, version=4)
    assert record.version == 4 and record.num_relations == 2 and record.relation_names == []
    assert record.import_id is None and record.entity_counts == {}
    assert record.iteration == IterationPosition()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d["entity_counts"].__setitem__("node", 3), "'node' is not"),
        (lambda d: d["entity_counts"].__setitem__("node_x", 3), "'node_x' is not"),
        (lambda d: d["entity_counts"].__setitem__("node_0", -1), "non-negative"),
        (lambda d: d["entity_counts"].__setitem__("node_0", "5"), "non-negative"),
        (lambda d: d["entity_counts"].__setitem__("node_0", None), "null"),
        (lambda d: d.__setitem__("entity_counts", []), "entity_counts is not an object"),
        (lambda d: d.__setitem__("iteration", "x"), "iteration is not an object"),
        (lambda d: d["iteration"].__setitem__("epoch_idx", -1), "iteration.epoch_idx"),
        (lambda d: d["iteration"].__setitem__("edge_path", 3), "iteration.edge_path"),
        (lambda d: d.__setitem__("relation_names", [1]), "relation_names"),
        (lambda d: d.__setitem__("num_relations", True), "num_relations"),
        (lambda d: d.__setitem__("time", "now"), "time"),
        (lambda d: d.pop("config"), "no 'config'"),
        (lambda d: d.__setitem__("format_version", 2), "format 2 is not supported"),
    ],
)
def test_bad_metadata_is_refused_naming_the_file(tmp_path: Path, change, why: str) -> None:
    store = CheckpointStore(tmp_path)
    store.write_metadata(_record(version=1, entity_counts={("node", 0): 3}))
    path = store.metadata_path(1)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=str(path)) as err:
        store.read_metadata(1)
    assert why in str(err.value)


def test_entity_types_with_underscores_load(tmp_path: Path) -> None:
    """Partition keys of types named like another type plus "_<n>" stay apart end to end."""
    cfg = make_config(
        tmp_path,
        entities={"user_item": {"num_partitions": 2}, "user_item_2": {"num_partitions": 1}},
        relations=[{"name": "r", "lhs": "user_item", "rhs": "user_item_2", "operator": "none"}],
    )
    rng = np.random.default_rng(0)
    embs = {
        ("user_item", 0): rng.random((3, 2), dtype=np.float32),
        ("user_item", 1): rng.random((4, 2), dtype=np.float32),
        ("user_item_2", 0): rng.random((5, 2), dtype=np.float32),
    }
    write_checkpoint(cfg, embs, ["r"])
    trained = load_trained(cfg.checkpoint_path)
    assert trained.entity_counts == {k: len(v) for k, v in embs.items()}
    assert trained.partition_bases["user_item"].tolist() == [0, 3, 7]
    assert trained.partition_bases["user_item_2"].tolist() == [0, 5]
    for (etype, part), emb in embs.items():
        assert np.array_equal(trained.mapped_embeddings(etype, part), emb)
    # a partition file that no longer matches the metadata is refused, naming the file
    path = trained.store.embeddings_path("user_item", 1, trained.version)
    np.save(path, np.zeros((4, 3), np.float32))
    with pytest.raises(CheckpointError, match=r"embeddings_user_item_1\.v1\.npy: shape \(4, 3\)"):
        trained.mapped_embeddings("user_item", 1)


OLD_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint_0.2.0"


def test_files_of_earlier_writers_read_and_write_back_the_same() -> None:
    """``training_stats.json`` and ``metadata.v1.json`` as bigembed 0.2.0 wrote them (a small
    two-partition run with eval_fraction, plus a merged distributed step): every record reads,
    and writes back exactly the object it was read from."""
    raw = json.loads((OLD_CHECKPOINT / "metadata.v1.json").read_text())
    record = CheckpointMetadata.from_json(raw, "metadata.v1.json", version=1)
    assert record.to_json() == raw and record.entity_counts[("node", 1)] > 0
    lines = [json.loads(line) for line in (OLD_CHECKPOINT / "training_stats.json").open()]
    log = parse_records(lines, "training_stats.json")
    assert len(log.buckets) + len(log.steps) == len(lines)
    assert {b.trainer for b in log.buckets} == {None, 0}
    assert any(b.timing is not None for b in log.buckets)
    assert any(s.eval_after is not None for s in log.steps)
    assert [r.to_json() for r in log.buckets] == [r for r in lines if r["type"] == "bucket"]
    assert [r.to_json() for r in log.steps] == [r for r in lines if r["type"] == "step"]
