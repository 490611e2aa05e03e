"""Resuming with a changed config: model-shaping keys refused in one line, the others logged.

Each model-shaping key is changed on a checkpoint written by hand (no training: the comparison
comes before anything is opened), so every case takes milliseconds; the cases that resume for
real train a 40-entity graph for one epoch.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.checkpoints import CheckpointStore, load_trained, start_over, state_mismatch
from bigembed.cli import main as cli_main
from bigembed.config import ConfigSchema
from bigembed.errors import CheckpointError
from support.checkpoints import user_item_config, write_checkpoint, write_config_file
from support.graphs import tiny_kg_config_file


def _user_item_checkpoint(root: Path) -> tuple[ConfigSchema, Path]:
    """``user_item_config`` (users in 2 partitions, items in 1, d=3, global embeddings, a
    linear and a translation relation) as a committed checkpoint; returns it and its file."""
    cfg = user_item_config(root)
    rng = np.random.default_rng(0)
    tables = {("user", 0): 3, ("user", 1): 2, ("item", 0): 4}
    write_checkpoint(
        cfg, {k: rng.normal(size=(n, 3)) for k, n in tables.items()}, ["buys", "follows"]
    )
    return cfg, write_config_file(cfg, root / "config.json")


def _listing(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def _error_line(capsys: pytest.CaptureFixture[str], command: str = "train") -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in err and "state_dict" not in err, err
    lines = [line for line in err.splitlines() if f"bigembed {command}: error:" in line]
    assert len(lines) == 1, err
    return lines[0]


TWO_RELATIONS = (
    '[{"name":"buys","lhs":"user","rhs":"item","operator":"linear"},'
    '{"name":"follows","lhs":"user","rhs":"user","operator":"translation"},'
    '{"name":"likes","lhs":"user","rhs":"item","operator":"linear"}]'
)
ONE_RELATION = '[{"name":"all","lhs":"user","rhs":"user","operator":"translation"}]'
THREE_TYPES = (
    '{"user":{"num_partitions":2},"item":{"num_partitions":1},"page":{"num_partitions":1}}'
)

# (the key as the message names it, the -p overrides, what the message says about it)
MODEL_SHAPING = [
    ("dimension", ["dimension=4"], "dimension 3 -> 4"),
    ("comparator", ["comparator=cos"], "comparator dot -> cos"),
    ("bias", ["bias=true"], "bias false -> true"),
    ("global_emb", ["global_emb=false"], "global_emb true -> false"),
    (
        "dynamic_relations",
        ["dynamic_relations=true", "global_emb=false", f"relations={ONE_RELATION}"],
        "dynamic_relations false -> true",
    ),
    ("operator", ["relations.0.operator=diagonal"], "relations.0.operator linear -> diagonal"),
    ("relation name", ["relations.0.name=purchases"], "relations.0.name buys -> purchases"),
    ("relation lhs", ["relations.1.lhs=item", "relations.1.rhs=item"], "relations.1.lhs user"),
    ("relation rhs", ["relations.1.rhs=item"], "relations.1.rhs user -> item"),
    ("relations", [f"relations={TWO_RELATIONS}"], 'relations ["buys","follows"] -> ["buys"'),
    ("entity types", [f"entities={THREE_TYPES}"], 'entities ["item","user"] -> ["item","page"'),
    (
        "num_partitions",
        ["entities.user.num_partitions=1"],
        "entities.user.num_partitions 2 -> 1",
    ),
    (
        "entity dimension",
        ["entities.item.dimension=5", "entities.user.dimension=5"],
        "entities.item.dimension null -> 5",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "said"), [c[1:] for c in MODEL_SHAPING], ids=[c[0] for c in MODEL_SHAPING]
)
def test_model_shaping_key_is_refused_in_one_line(
    tmp_path: Path, capsys, overrides: list[str], said: str
) -> None:
    cfg, config = _user_item_checkpoint(tmp_path)
    before = _listing(Path(cfg.checkpoint_path))
    params = [a for o in overrides for a in ("-p", o)]
    assert cli_main(["train", str(config), "--no-progress", *params]) == 2
    line = _error_line(capsys)
    assert said in line
    assert f"{cfg.checkpoint_path}: holds a model trained with other" in line
    assert "another checkpoint_path" in line and "--fresh" in line
    assert _listing(Path(cfg.checkpoint_path)) == before  # compared first: nothing written


def test_featurized_in_the_record_is_compared(tmp_path: Path, capsys) -> None:
    # featurized: true cannot be configured (bigembed refuses it), but a record may carry it
    cfg, config = _user_item_checkpoint(tmp_path)
    meta = CheckpointStore(cfg.checkpoint_path).metadata_path(1)
    data = json.loads(meta.read_text())
    data["config"]["entities"]["item"]["featurized"] = True
    meta.write_text(json.dumps(data))
    assert cli_main(["train", str(config), "--no-progress"]) == 2
    assert "entities.item.featurized true -> false" in _error_line(capsys)


def test_many_differences_are_one_line_with_a_count(tmp_path: Path, capsys) -> None:
    _cfg, config = _user_item_checkpoint(tmp_path)
    params = ["dimension=4", "comparator=cos", "bias=true", "global_emb=false"]
    params += ["relations.0.operator=diagonal", "entities.user.num_partitions=1"]
    argv = ["train", str(config), "--no-progress", *(a for p in params for a in ("-p", p))]
    assert cli_main(argv) == 2
    line = _error_line(capsys)
    assert "dimension 3 -> 4" in line and "(and 2 more)" in line


def test_a_record_without_a_key_is_compared_on_what_it_has(tmp_path: Path, capsys) -> None:
    cfg, config = _user_item_checkpoint(tmp_path)
    meta = CheckpointStore(cfg.checkpoint_path).metadata_path(1)
    data = json.loads(meta.read_text())
    del data["config"]["comparator"]  # a record from before the key existed
    meta.write_text(json.dumps(data))
    argv = ["train", str(config), "--no-progress", "-p", "comparator=cos", "-p", "dimension=4"]
    assert cli_main(argv) == 2
    line = _error_line(capsys)
    assert "dimension 3 -> 4" in line and "comparator" not in line


# ---------------------------------------------------------------------- resuming for real
@pytest.fixture
def trained_tiny(tmp_path: Path) -> Path:
    """A 40-entity graph (d=8, diagonal operator, dynamic relations) trained for one epoch;
    returns its config file (checkpoint in ``tmp_path/model``)."""
    config, _ = tiny_kg_config_file(tmp_path, 40, 400, num_epochs=1, eval_fraction=0.0)
    assert cli_main(["train", str(config), "--no-progress"]) == 0
    return config


def test_training_only_keys_are_accepted_and_logged(trained_tiny: Path, capsys, caplog) -> None:
    argv = ["train", str(trained_tiny), "--no-progress", "-p", "lr=0.05", "-p", "num_epochs=2"]
    argv += ["-p", "num_uniform_negs=5"]
    with caplog.at_level(logging.INFO):
        assert cli_main(argv) == 0
    assert "to checkpoint version 2" in capsys.readouterr().out
    changed = [r.getMessage() for r in caplog.records if "changed training settings" in r.message]
    assert len(changed) == 1, changed
    for text in ("lr 0.01 -> 0.05", "num_epochs 1 -> 2", "num_uniform_negs 10 -> 5"):
        assert text in changed[0]


def test_fresh_starts_over_and_keeps_foreign_files(trained_tiny: Path, capsys) -> None:
    model = trained_tiny.parent / "model"
    (model / "notes.txt").write_text("mine")
    argv = ["train", str(trained_tiny), "--no-progress", "-p", "dimension=4"]
    assert cli_main(argv) == 2
    assert "dimension 8 -> 4" in _error_line(capsys)
    assert cli_main([*argv, "--fresh"]) == 0
    out = capsys.readouterr().out
    assert "--fresh: deleted the checkpoint" in out and "to checkpoint version 1" in out
    assert load_trained(model).config.dimension == 4
    assert (model / "notes.txt").read_text() == "mine"


def test_fresh_refuses_a_directory_it_cannot_prove_is_a_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "model"
    ckpt.mkdir()
    (ckpt / "model.v1.pt").write_bytes(b"someone else's")  # an own name, but no committed version
    (ckpt / "data.csv").write_text("a,b\n")
    before = _listing(ckpt)
    with pytest.raises(CheckpointError, match="can prove bigembed wrote"):
        start_over(ckpt)
    assert _listing(ckpt) == before
    assert start_over(tmp_path / "nothing") == 0


def test_fresh_finishes_an_interrupted_start_over(trained_tiny: Path) -> None:
    model = trained_tiny.parent / "model"
    (model / ".start_over_in_progress").write_text("")
    (model / "checkpoint_version.txt").unlink()  # killed after deleting the version file
    assert start_over(model) > 0
    assert list(model.iterdir()) == []


def test_a_record_edited_by_hand_is_still_one_line(trained_tiny: Path, capsys) -> None:
    # the record claims d=4 (so the comparison passes) but the model file holds d=8 tensors
    model = trained_tiny.parent / "model"
    meta = CheckpointStore(model).metadata_path(1)
    data = json.loads(meta.read_text())
    data["config"]["dimension"] = 4
    meta.write_text(json.dumps(data))
    argv = ["train", str(trained_tiny), "--no-progress", "-p", "dimension=4", "-p", "num_epochs=2"]
    assert cli_main(argv) == 2
    assert "do not fit this config" in _error_line(capsys)


def test_state_mismatch_is_one_line_on_the_reading_path(trained_tiny: Path, capsys) -> None:
    # eval, predict, export and convert all read through load_trained
    model = trained_tiny.parent / "model"
    store = CheckpointStore(model)
    payload = store.load_model(1)
    payload["model"]["stray.weight"] = torch.zeros(3)
    store.save_model(1, payload)
    with pytest.raises(CheckpointError) as caught:
        load_trained(model)
    assert "\n" not in str(caught.value) and "'stray.weight' not in the config" in str(caught.value)
    out = str(model.parent / "out")
    assert cli_main(["export", str(model), "--format", "npy", "--output", out]) == 2
    _error_line(capsys, "export")


def test_state_mismatch_names_shapes_missing_and_unexpected() -> None:
    model = torch.nn.Linear(3, 2)
    assert state_mismatch(model, model.state_dict()) is None
    saved = {"weight": torch.zeros(2, 4), "extra": torch.zeros(1)}
    text = state_mismatch(model, saved)
    assert text is not None and "\n" not in text
    assert "'weight' is (2, 4) in the file, (2, 3) in the config" in text
    assert "'bias' missing" in text and "'extra' not in the config" in text


def test_warm_start_refuses_another_shape_and_warns_on_meaning(
    trained_tiny: Path, capsys, caplog
) -> None:
    root = trained_tiny.parent
    argv = ["train", str(trained_tiny), "--no-progress", "-p", f"init_path={root / 'model'}"]
    argv += ["-p", f"checkpoint_path={root / 'warm'}"]
    assert cli_main([*argv, "-p", "dimension=4"]) == 2
    line = _error_line(capsys)
    assert f"init_path {root / 'model'}: holds a model of another shape" in line
    assert "dimension 8 -> 4" in line
    with caplog.at_level(logging.WARNING):
        assert cli_main([*argv, "-p", "comparator=dot"]) == 0
    assert any("comparator cos -> dot" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- the demo
def _tiny_fb15k(root: Path) -> dict[str, Path]:
    """Three gzip'd TSV splits of a 30-entity, 3-relation graph in FB15k-237's layout."""
    rng = np.random.default_rng(0)
    files = {}
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        heads, rels = rng.integers(0, 30, n), rng.integers(0, 3, n)
        edges = zip(heads, rels, strict=True)
        lines = "".join(f"e{h}\tr{r}\te{(h * (r + 2)) % 30}\n" for h, r in edges)
        files[split] = root / f"{split}.txt.gz"
        files[split].write_bytes(gzip.compress(lines.encode()))
    return files


def test_demo_rerun_with_another_dimension(tmp_path: Path, capsys, monkeypatch) -> None:
    import bigembed.commands.demo as demo

    files = _tiny_fb15k(tmp_path)
    monkeypatch.setattr(demo, "fb15k237_files", lambda: files)
    work = tmp_path / "demo"
    argv = ["demo", "--workdir", str(work), "--epochs", "1", "--workers", "1", "--no-progress"]
    assert cli_main([*argv, "--dimension", "4"]) == 0
    capsys.readouterr()
    assert cli_main([*argv, "--dimension", "8"]) == 2
    line = _error_line(capsys, "demo")
    assert "dimension 4 -> 8" in line and "--fresh" in line and "--workdir" in line
    # --fresh starts the demo's own outputs over and nothing else in the work directory
    (work / "notes.txt").write_text("mine")
    (work / "model" / "mine.txt").write_text("mine too")
    assert cli_main([*argv, "--dimension", "8", "--fresh"]) == 0
    assert (work / "notes.txt").read_text() == "mine"
    assert (work / "model" / "mine.txt").read_text() == "mine too"
    assert CheckpointStore(work / "model").read_metadata().config["dimension"] == 8
    # a work directory that is not the demo's: nothing in it is deleted
    other = tmp_path / "other"
    (other / "model").mkdir(parents=True)
    (other / "model" / "thesis.tex").write_text("years of work")
    (other / "thesis.pdf").write_text("years of work")
    other_argv = ["demo", "--workdir", str(other), "--fresh", *argv[3:], "--dimension", "4"]
    assert cli_main(other_argv) == 0
    assert (other / "thesis.pdf").read_text() == "years of work"
    assert (other / "model" / "thesis.tex").read_text() == "years of work"


def test_fresh_is_refused_for_a_distributed_run(tmp_path: Path, capsys) -> None:
    cfg, config = _user_item_checkpoint(tmp_path)
    before = _listing(Path(cfg.checkpoint_path))
    argv = ["train", str(config), "--fresh", "-p", "num_machines=2"]
    argv += ["-p", "distributed_init_method=tcp://127.0.0.1:9"]
    assert cli_main(argv) == 2
    assert "--fresh: single machine only" in _error_line(capsys)
    assert _listing(Path(cfg.checkpoint_path)) == before
