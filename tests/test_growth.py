"""Growing a trained model: ``import --extend``, then ``train`` grows and continues the model.

An extension keeps every old entity's (partition, offset) and fills the smallest partitions
first; a checkpoint of the old store is a prefix of the new one, not an orphan; growing keeps
every old row and its Adagrad state bit for bit; ``growth.freeze`` keeps them through training;
``growth.init: neighbors`` starts a new row at its old neighbours' mean; ``growth.edges: new``
hands the trainer only the edges touching a new entity, plus the replay share of the others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bigembed.checkpoints import CheckpointStore, choose_version, load_trained
from bigembed.cli import main as cli_main
from bigembed.config import GrowthSchema, load_config
from bigembed.importing.extension import fill_smallest_first
from bigembed.storage import EntityStore
from bigembed.train import Iteration, TrainingJob, TrainingLoop, grow_checkpoint, init_embeddings
from support.imports import random_edges, write_config, write_tsv

OLD = random_edges(300, 24, ["r"])
NEW = [*OLD, *((f"n{i}", "r", f"e{i % 24}") for i in range(10)), ("n0", "r", "n1")]
TRAIN = ["--no-progress", "-p", "workers=1"]
KVSALL = ["-p", "loss_fn=softmax", "-p", "comparator=dot"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().err


def _ids(path: Path) -> dict[str, tuple[int, int]]:
    store = EntityStore(path)
    return {
        name: (part, offset)
        for part in range(store.num_partitions("node"))
        for offset, name in enumerate(store.names("node", part))
    }


def _tables(checkpoint: Path, version: int, parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    store = CheckpointStore(checkpoint)
    return [
        (
            np.load(store.embeddings_path("node", p, version)),
            np.load(store.optimizer_path("node", p, version)),
        )
        for p in range(parts)
    ]


def _trained_then_extended(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    new: list[tuple[str, ...]] = NEW,
    mode: list[str] | None = None,
) -> Path:
    """The OLD graph imported into 3 partitions and trained one epoch (with the ``mode``
    overrides), then extended by ``new``; returns the config."""
    kvsall = "train_type=kvsall" in (mode or [])  # one partition, dynamic relations
    config = write_config(tmp_path, entities={"node": 1 if kvsall else 3}, dynamic=kvsall)
    write_tsv(tmp_path / "old.tsv", OLD)
    write_tsv(tmp_path / "new.tsv", new)
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "old.tsv"))[0] == 0
    assert _run(capsys, "train", str(config), *TRAIN, *(mode or []), "-p", "num_epochs=1")[0] == 0
    replace = ["import", "--no-progress", "--force", str(config), str(tmp_path / "new.tsv")]
    code, err = _run(capsys, *replace)
    assert code != 0 and "were trained on this entity store" in err  # a replacement orphans
    extend = ["import", "--no-progress", "--extend", str(config), str(tmp_path / "new.tsv")]
    assert _run(capsys, *extend)[0] == 0
    return config


def test_fill_smallest_first() -> None:
    assert fill_smallest_first([5, 3, 9], 4) == [1, 3, 0]
    assert fill_smallest_first([4, 4], 3) == [2, 1]
    assert fill_smallest_first([2, 7, 2], 20) == [9, 3, 8]  # 11, 10, 10
    assert fill_smallest_first([1, 1], 0) == [0, 0]


def test_extend_keeps_every_old_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, entities={"node": 3})
    write_tsv(tmp_path / "old.tsv", OLD)
    write_tsv(tmp_path / "new.tsv", NEW[len(OLD) :])  # the new edges only: old ids kept anyway
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "old.tsv"))[0] == 0
    entities = tmp_path / "out" / "entities"
    before, old_store = _ids(entities), EntityStore(entities)
    argv = ["import", "--no-progress", "--extend", str(config), str(tmp_path / "new.tsv")]
    assert _run(capsys, *argv)[0] == 0
    after, new_store = _ids(entities), EntityStore(entities)
    assert {n: after[n] for n in before} == before
    assert set(after) - set(before) == {f"n{i}" for i in range(10)}
    counts = new_store.counts("node")
    assert max(counts) - min(counts) <= 1 and sum(counts) == len(before) + 10
    assert [e.import_id for e in new_store.extends] == [old_store.import_id]
    assert new_store.extends[0].counts == {"node": tuple(old_store.counts("node"))}
    # the same extension again is the same store (same id, same record)
    assert _run(capsys, *argv)[0] == 0
    again = EntityStore(entities)
    assert again.import_id == new_store.import_id and again.extends == new_store.extends


def test_extend_refuses_new_relation_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, entities={"node": 2}, dynamic=True)
    write_tsv(tmp_path / "old.tsv", OLD)
    write_tsv(tmp_path / "new.tsv", [("a", "other", "b")])
    code, err = _run(  # nothing to extend yet
        capsys, "import", "--no-progress", "--extend", str(config), str(tmp_path / "old.tsv")
    )
    assert code != 0 and "entity store not found" in err and len(err.strip().splitlines()) == 1
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "old.tsv"))[0] == 0
    code, err = _run(
        capsys, "import", "--no-progress", "--extend", str(config), str(tmp_path / "new.tsv")
    )
    assert code != 0 and "--extend adds entities only" in err and "'other'" in err
    assert len(err.strip().splitlines()) == 1


def test_extension_does_not_orphan_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _trained_then_extended(tmp_path, capsys)  # no --allow-orphans needed
    entities = tmp_path / "out" / "entities"
    assert not (entities / "previous_imports").exists()
    # readers name the way forward instead of "remap"
    out = str(tmp_path / "x")
    code, err = _run(
        capsys, "export", str(tmp_path / "out" / "model"), "--format", "tsv", "-o", out
    )
    assert code != 0 and "extended with new entities" in err
    # training continues it: the next version is the grown model, on the new import
    assert _run(capsys, "train", str(config), *TRAIN, "-p", "num_epochs=2")[0] == 0
    trained = load_trained(tmp_path / "out" / "model")
    assert trained.version == 2 and trained.import_id == EntityStore(entities).import_id
    assert sum(trained.entity_counts.values()) == len(_ids(entities))


def test_growth_keeps_old_rows_bit_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _trained_then_extended(tmp_path, capsys)
    checkpoint = tmp_path / "out" / "model"
    old = _tables(checkpoint, 1, 3)
    cfg = load_config(config)
    store = CheckpointStore(checkpoint)
    grown = grow_checkpoint(TrainingJob(cfg), store, store.committed_version())
    assert grown is not None and grown.new_rows == {"node": 10}
    for part, ((emb, state), (new_emb, new_state)) in enumerate(
        zip(old, _tables(checkpoint, 2, 3), strict=True)
    ):
        n = len(emb)
        assert np.array_equal(new_emb[:n], emb) and np.array_equal(new_state[:n], state)
        fresh = init_embeddings(len(new_emb), cfg.dimension, cfg.init_scale, cfg.seed, "node", part)
        assert np.array_equal(new_emb[n:], fresh.numpy()[n:])
        assert not new_state[n:].any()


@pytest.mark.parametrize(
    "mode",
    [[], ["-p", "relations.0.all_negs=true"], ["-p", "train_type=kvsall", *KVSALL]],
    ids=["sampled", "all_negs", "kvsall"],
)
def test_freeze_keeps_old_rows_and_relations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: list[str]
) -> None:
    config = _trained_then_extended(tmp_path, capsys, mode=mode)
    checkpoint = tmp_path / "out" / "model"
    parts = EntityStore(tmp_path / "out" / "entities").num_partitions("node")
    old = _tables(checkpoint, 1, parts)
    old_model = CheckpointStore(checkpoint).load_model(1)["model"]
    freeze = ["-p", "growth.freeze=old_entities,relations", "-p", "num_epochs=3", *mode]
    code, err = _run(capsys, "train", str(config), *TRAIN, *freeze)
    assert code == 0, err
    cfg = load_config(config)
    changed = 0
    for part, ((emb, state), (new_emb, new_state)) in enumerate(
        zip(old, _tables(checkpoint, 3, parts), strict=True)
    ):
        n = len(emb)
        assert np.array_equal(new_emb[:n], emb) and np.array_equal(new_state[:n], state)
        fresh = init_embeddings(len(new_emb), cfg.dimension, cfg.init_scale, cfg.seed, "node", part)
        changed += int((new_emb[n:] != fresh.numpy()[n:]).any(axis=1).sum())
    assert changed == 10  # every new entity has edges, so every new row trained
    new_model = CheckpointStore(checkpoint).load_model(3)["model"]
    for key, value in old_model.items():
        assert np.array_equal(np.asarray(value), np.asarray(new_model[key])), key


def test_neighbors_init_is_the_mean_of_old_neighbours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = [*OLD, ("x", "r", "e1"), ("e2", "r", "x"), ("x", "r", "e1"), ("y", "r", "z")]
    config = _trained_then_extended(tmp_path, capsys, new)
    checkpoint = tmp_path / "out" / "model"
    before = EntityStore(tmp_path / "out" / "entities").extends[0].counts["node"]
    ids = _ids(tmp_path / "out" / "entities")
    old = _tables(checkpoint, 1, 3)
    cfg = load_config(config)
    cfg = cfg.model_copy(update={"growth": GrowthSchema(init="neighbors")})
    store = CheckpointStore(checkpoint)
    grown = grow_checkpoint(TrainingJob(cfg), store, 1)
    assert grown is not None and grown.seeded_by_neighbours == {"node": 1}
    new_tables = _tables(checkpoint, 2, 3)

    def row(name: str, tables: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        part, offset = ids[name]
        return tables[part][0][offset]

    # x: neighbours e1 (twice: once per edge) and e2, averaged over its edges
    want = (2 * row("e1", old) + row("e2", old)) / 3
    np.testing.assert_allclose(row("x", new_tables), want, rtol=1e-6, atol=1e-7)
    for name in ("y", "z"):  # only new neighbours: random, as a fresh model's row
        part, offset = ids[name]
        assert offset >= before[part]
        fresh = init_embeddings(
            len(new_tables[part][0]), cfg.dimension, cfg.init_scale, cfg.seed, "node", part
        )
        assert np.array_equal(row(name, new_tables), fresh.numpy()[offset])


def test_readers_skip_a_best_version_of_the_old_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, entities={"node": 3})
    write_tsv(tmp_path / "old.tsv", OLD)
    write_tsv(tmp_path / "new.tsv", NEW)
    write_tsv(tmp_path / "valid.tsv", OLD[:20])
    # the first evaluation is the best, and no later one beats it by min_delta
    stopping = f'early_stopping={{"valid_path": "{tmp_path / "valid.tsv"}", "min_delta": 1e9}}'
    argv = ["train", str(config), *TRAIN, "-p", stopping]
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "old.tsv"))[0] == 0
    assert _run(capsys, *argv, "-p", "num_epochs=1")[0] == 0
    checkpoint = tmp_path / "out" / "model"
    assert choose_version(checkpoint).directory == checkpoint / "best"
    extend = ["import", "--no-progress", "--extend", str(config), str(tmp_path / "new.tsv")]
    assert _run(capsys, *extend)[0] == 0
    assert _run(capsys, *argv, "-p", "num_epochs=2")[0] == 0
    assert CheckpointStore(checkpoint).read_best()["version"] == 1
    chosen = choose_version(checkpoint)
    assert chosen.directory == checkpoint and "earlier import" in (chosen.note or "")
    assert _run(capsys, "similar", str(checkpoint), "e1")[0] == 0


def test_new_edges_train_only_edges_touching_new_entities(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _trained_then_extended(tmp_path, capsys)
    entities = tmp_path / "out" / "entities"
    names = {place: name for name, place in _ids(entities).items()}
    steps: dict[int, list[tuple[str, str]]] = {}
    prepare = TrainingLoop._prepare_edges

    def recording(self: TrainingLoop, it: Iteration, bucket: tuple[int, int], pool: object):
        held_out, edges = prepare(self, it, bucket, pool)  # type: ignore[arg-type]
        pairs = zip(edges.lhs.tolist(), edges.rhs.tolist(), strict=True)
        steps.setdefault(it.index, []).extend(
            (names[(bucket[0], a)], names[(bucket[1], b)]) for a, b in pairs
        )
        return held_out, edges

    monkeypatch.setattr(TrainingLoop, "_prepare_edges", recording)
    new = sorted((lhs, rhs) for lhs, _, rhs in NEW if lhs[0] == "n" or rhs[0] == "n")
    only_new = ["-p", "growth.edges=new", "-p", "growth.replay_fraction=0", "-p", "eval_fraction=0"]
    assert _run(capsys, "train", str(config), *TRAIN, *only_new, "-p", "num_epochs=3")[0] == 0
    assert sorted(steps) == [1, 2] and all(sorted(seen) == new for seen in steps.values())
    # with a replay share: every new edge, and a new sample of the old ones each epoch
    steps.clear()
    replay = [
        "-p",
        "growth.edges=new",
        "-p",
        "growth.replay_fraction=0.25",
        "-p",
        "eval_fraction=0",
    ]
    assert _run(capsys, "train", str(config), *TRAIN, *replay, "-p", "num_epochs=5")[0] == 0
    samples = []
    for seen in steps.values():
        assert set(new) <= set(seen)
        old = [e for e in seen if e not in new]
        assert 0.1 * len(OLD) < len(old) < 0.4 * len(OLD)
        samples.append(sorted(old))
    assert len(samples) == 2 and samples[0] != samples[1]


def test_new_edges_with_frozen_old_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _trained_then_extended(tmp_path, capsys)
    checkpoint = tmp_path / "out" / "model"
    old = _tables(checkpoint, 1, 3)
    update = ["-p", "growth.edges=new", "-p", "growth.freeze=old_entities", "-p", "num_epochs=3"]
    assert _run(capsys, "train", str(config), *TRAIN, *update)[0] == 0
    for (emb, state), (new_emb, new_state) in zip(old, _tables(checkpoint, 3, 3), strict=True):
        n = len(emb)
        assert np.array_equal(new_emb[:n], emb) and np.array_equal(new_state[:n], state)
        assert new_state[n:].all()  # every new row trained


def test_new_edges_refused_without_an_extension_and_replay_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, entities={"node": 2})
    write_tsv(tmp_path / "old.tsv", OLD)
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "old.tsv"))[0] == 0
    code, err = _run(capsys, "train", str(config), *TRAIN, "-p", "growth.edges=new")
    assert code != 0 and "growth.edges: new, but" in err and "extends no import" in err
    assert len(err.strip().splitlines()) == 1
    code, err = _run(capsys, "train", str(config), *TRAIN, "-p", "growth.replay_fraction=1.5")
    assert code != 0 and "growth.replay_fraction" in err


def test_old_mean_state_starts_new_rows_at_the_old_rows_pace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``growth.init_state: old_mean``: every new row's Adagrad state is the mean state of its
    partition's old rows; the old rows keep theirs bit for bit."""
    config = _trained_then_extended(tmp_path, capsys)
    checkpoint = tmp_path / "out" / "model"
    old = _tables(checkpoint, 1, 3)
    cfg = load_config(config)
    cfg = cfg.model_copy(update={"growth": GrowthSchema(init_state="old_mean")})
    store = CheckpointStore(checkpoint)
    assert grow_checkpoint(TrainingJob(cfg), store, 1) is not None
    grown_rows = 0
    for (emb, state), (new_emb, new_state) in zip(old, _tables(checkpoint, 2, 3), strict=True):
        n = len(emb)
        assert np.array_equal(new_emb[:n], emb) and np.array_equal(new_state[:n], state)
        assert state.mean() > 0  # trained one epoch: the old rows have a state
        np.testing.assert_allclose(new_state[n:], np.float32(state.mean()), rtol=1e-6)
        grown_rows += len(new_emb) - n
    assert grown_rows == 10
