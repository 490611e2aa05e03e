"""Import identity, orphaned checkpoints and `bigembed remap`, through the CLI.

The same entities imported again give the same import id (a model trained on the first import
stays usable); ``import --force`` refuses to orphan a checkpoint trained on the store unless
``--allow-orphans``; ``bigembed remap`` then matches the model's rows to the new names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bigembed.checkpoints import load_trained
from bigembed.cli import main as cli_main
from bigembed.storage import EntityStore
from bigembed.train import init_embeddings
from support.imports import do_import, random_edges, write_config, write_tsv

EDGES = random_edges(200, 20, ["r"])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _trained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """A 2-partition graph imported and trained one epoch: (config, checkpoint)."""
    config = write_config(tmp_path, entities={"node": 2})
    write_tsv(tmp_path / "a.tsv", EDGES)
    assert _run(capsys, "import", "--no-progress", str(config), str(tmp_path / "a.tsv"))[0] == 0
    train = ["train", "--no-progress", str(config), "-p", "num_epochs=1", "-p", "workers=1"]
    assert _run(capsys, *train)[0] == 0
    return config, tmp_path / "out" / "model"


def _rows(checkpoint: Path, entities: Path) -> dict[str, tuple[np.ndarray, float]]:
    """Embedding row and row-Adagrad state of every entity name of a checkpoint."""
    trained = load_trained(checkpoint)
    store = EntityStore(entities)
    out = {}
    for part in range(store.num_partitions("node")):
        emb = trained.mapped_embeddings("node", part)
        state = np.load(trained.store.optimizer_path("node", part, trained.version))
        for offset, name in enumerate(store.names("node", part)):
            out[name] = (np.array(emb[offset]), float(state[offset]))
    return out


def test_the_same_entities_give_the_same_import_id(tmp_path: Path) -> None:
    """Line order and place do not matter; the seed (which orders the offsets) does."""
    write_tsv(tmp_path / "a.tsv", EDGES)
    write_tsv(tmp_path / "b.tsv", EDGES[::-1])
    ids = []
    for name, data, seed in (("one", "a", 0), ("two", "b", 0), ("three", "a", 1)):
        root = tmp_path / name
        root.mkdir()
        cfg, _ = do_import(write_config(root, seed=seed), [tmp_path / f"{data}.tsv"])
        ids.append(EntityStore(cfg.entity_path).import_id)
    assert ids[0] == ids[1] != ids[2]
    assert ids[0] is not None and ids[0].startswith("content-")


def test_the_identity_digests_names_not_their_layout_in_memory() -> None:
    """Where one name ends and the next begins counts; slices and chunks do not."""
    import pyarrow as pa

    from bigembed.storage import content_import_id

    def one(*parts: pa.Array) -> str:
        return content_import_id({"node": list(parts)}, ["r"], False)

    names = pa.array(["x", "ab", "c", "d"])
    assert one(names.slice(1, 2)) == one(pa.array(["ab", "c"]))
    assert one(pa.chunked_array([["ab"], ["c"]])) == one(pa.array(["ab", "c"]))
    assert one(pa.array(["ab", "c"])) != one(pa.array(["a", "bc"]))
    assert one(pa.array(["ab"]), pa.array(["c"])) != one(pa.array(["ab", "c"]))
    assert content_import_id({"node": [names]}, ["r"], True) != one(names)


def test_reimporting_the_same_data_keeps_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`import --force` of the same edges (another line order) is no refusal and the model stays
    usable; a checkpoint from before content-derived ids is told how to get back."""
    config, ck = _trained(tmp_path, capsys)
    entities = tmp_path / "out" / "entities"
    before = EntityStore(entities).import_id
    write_tsv(tmp_path / "again.tsv", EDGES[::-1])
    code, _, err = _run(
        capsys, "import", "--no-progress", str(config), str(tmp_path / "again.tsv"), "--force"
    )
    assert code == 0, err
    assert EntityStore(entities).import_id == before
    code, out, err = _run(capsys, "similar", str(ck), "e1")
    assert code == 0 and "e1" in out, err

    # a checkpoint recording a random id of an older bigembed: the message says the way out
    meta = ck / "metadata.v1.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "import_id": f"{'ab' * 16}-{'cd' * 16}"}))
    code, _, err = _run(capsys, "similar", str(ck), "e1")
    line = _one_line(err)
    assert code == 2 and "made before bigembed derived import ids" in line, line
    assert f"bigembed remap {ck} --from-entities" in line
    code, _, err = _run(capsys, "remap", str(ck))
    assert code == 2 and "--from-entities" in _one_line(err)
    other = tmp_path / "original"
    code, _, err = _run(
        capsys,
        "import",
        "--no-progress",
        str(config),
        str(tmp_path / "a.tsv"),
        "-p",
        f"entity_path={other / 'entities'}",
        "-p",
        f"edge_paths={other / 'edges'}",
    )
    assert code == 0, err
    code, out, err = _run(capsys, "remap", str(ck), "--from-entities", str(other / "entities"))
    assert code == 0, err
    assert "node: 20 kept, 0 new, 0 dropped" in out
    assert _run(capsys, "similar", str(tmp_path / "out" / "model-remapped"), "e1")[0] == 0


def test_a_changed_import_refuses_orphans_and_remap_matches_rows_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, ck = _trained(tmp_path, capsys)
    entities = tmp_path / "out" / "entities"
    old_rows = _rows(ck, entities)
    manifest = (entities / "manifest.json").read_bytes()
    # e0 renamed x0, e1's edges gone, two new entities
    changed = [
        tuple("x0" if n == "e0" else n for n in row)
        for row in EDGES
        if "e1" not in (row[0], row[2])
    ] + [("new1", "r", "e3"), ("e4", "r", "new2")]
    write_tsv(tmp_path / "b.tsv", changed)
    force = ["import", "--no-progress", str(config), str(tmp_path / "b.tsv"), "--force"]

    copy = tmp_path / "copy"
    shutil.copytree(entities, copy / "entities")  # a copy claims none of the original's models
    overrides = ["-p", f"entity_path={copy / 'entities'}", "-p", f"edge_paths={copy / 'edges'}"]
    assert _run(capsys, *force, *overrides)[0] == 0

    code, _, err = _run(capsys, *force)
    line = _one_line(err)
    assert code == 2 and str(ck) in line and "--allow-orphans" in line, line
    assert (entities / "manifest.json").read_bytes() == manifest  # nothing published
    assert _run(capsys, "similar", str(ck), "e1")[0] == 0

    code, _, err = _run(capsys, *force, "--allow-orphans")
    assert code == 0, err
    code, _, err = _run(capsys, "similar", str(ck), "e2")
    line = _one_line(err)
    assert code == 2 and f"run `bigembed remap {ck}`" in line, line

    ck_files = {p.name: p.read_bytes() for p in ck.iterdir() if p.is_file()}
    code, out, err = _run(capsys, "remap", str(ck))
    assert code == 0, err
    names = {n for row in changed for n in (row[0], row[2])}
    kept, dropped = names & set(old_rows), set(old_rows) - names
    assert {"e0", "e1"} <= dropped and {"x0", "new1", "new2"} == names - kept
    summary = f"node: {len(kept)} kept, 3 new, {len(dropped)} dropped (e.g. "
    assert summary in out, out
    shown = out.split(summary)[1].split(")")[0].split(", ")
    assert 0 < len(shown) <= 3 and {s.strip("'.") for s in shown} - {""} <= dropped, shown
    assert {p.name: p.read_bytes() for p in ck.iterdir() if p.is_file()} == ck_files
    remapped = tmp_path / "out" / "model-remapped"
    new_rows = _rows(remapped, entities)
    assert set(new_rows) == names
    store = EntityStore(entities)
    cfg = load_trained(remapped).config
    for name, (row, state) in new_rows.items():
        if name in old_rows:
            assert np.array_equal(row, old_rows[name][0]) and state == old_rows[name][1], name
        else:  # a fresh model's row (seeded per partition), Adagrad from zero
            found = store.offset_of("node", name)
            assert found is not None
            part, offset = found
            init = init_embeddings(
                store.count("node", part), 8, cfg.init_scale, cfg.seed, "node", part
            )
            assert np.allclose(row, init[offset].numpy()) and state == 0.0, name

    code, out, err = _run(capsys, "similar", str(remapped), "x0")
    assert code == 0 and "x0" in out, err
    code, _, err = _run(capsys, "remap", str(ck))
    assert code == 2 and "--force" in _one_line(err)  # never replaced without asking
    train = ["train", "--no-progress", str(config), "-p", "num_epochs=2", "-p", "workers=1"]
    code, _, err = _run(capsys, *train, "-p", f"checkpoint_path={remapped}")
    assert code == 0, err
    assert load_trained(remapped).version == 2


def test_a_store_from_before_content_ids_keeps_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store and checkpoint with a random id of an older bigembed: the same data imported
    again keeps that id (the model stays usable); other data keeps the old names for remap."""
    config, ck = _trained(tmp_path, capsys)
    legacy = f"{'ab' * 16}-{'cd' * 16}"
    for path in (tmp_path / "out" / "entities", tmp_path / "out" / "edges", ck):
        manifest = path / ("metadata.v1.json" if path == ck else "manifest.json")
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "import_id": legacy}))
    write_tsv(tmp_path / "again.tsv", EDGES[::-1])
    force = ["import", "--no-progress", str(config), "--force"]
    assert _run(capsys, *force, str(tmp_path / "again.tsv"))[0] == 0
    assert EntityStore(tmp_path / "out" / "entities").import_id == legacy
    assert _run(capsys, "similar", str(ck), "e1")[0] == 0
    assert _run(capsys, "eval", "--no-progress", str(config))[0] == 0  # edges: the same id

    write_tsv(tmp_path / "b.tsv", [*EDGES, ("new1", "r", "e3")])
    code, _, err = _run(capsys, *force, str(tmp_path / "b.tsv"))
    assert code == 2 and "--allow-orphans" in _one_line(err)
    assert _run(capsys, *force, str(tmp_path / "b.tsv"), "--allow-orphans")[0] == 0
    code, _, err = _run(capsys, "similar", str(ck), "e1")
    assert code == 2 and f"run `bigembed remap {ck}`" in _one_line(err)
    code, out, err = _run(capsys, "remap", str(ck))
    assert code == 0 and "node: 20 kept, 1 new, 0 dropped" in out, err
