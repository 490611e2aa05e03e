"""Early stopping through the CLI: validation evals, the best version kept, stop, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bigembed.cli import main as cli_main
from support.graphs import tiny_kg_config_file


def _setup(root: Path, **early: object) -> Path:
    path, valid = tiny_kg_config_file(
        root, 60, 900, valid=True, num_epochs=10, lr=0.1, eval_fraction=0.0
    )
    data = yaml.safe_load(path.read_text())
    data["early_stopping"] = {"valid_path": str(valid), **early}
    path.write_text(yaml.safe_dump(data))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _records(root: Path) -> list[dict]:
    text = (root / "model" / "validation_stats.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_stops_after_patience_keeps_best_and_stays_stopped(tmp_path, capsys) -> None:
    # min_delta 1.0: no later evaluation can beat the first, so the stop point is certain
    config = _setup(tmp_path, patience=2, min_delta=1.0)
    code, out, err = _run(capsys, "train", str(config), "--no-progress")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("validation after epoch")]
    assert len(lines) == 3 and "(new best)" in lines[0] and "2/2 without gain" in lines[2]
    assert "Stopped early: early stopping: validation mrr did not improve" in out
    model = tmp_path / "model"
    assert (model / "checkpoint_version.txt").read_text().strip() == "3"  # not 10
    best = json.loads((model / "best" / "best.json").read_text())
    assert best["version"] == 1 and best["metric"] == "mrr"
    assert [r["version"] for r in _records(tmp_path)] == [1, 2, 3]
    assert _records(tmp_path)[-1]["stop"] is True
    assert not list(model.glob("*.v1.*"))  # version 1 left the directory; best/ keeps it
    # a stopped run stays stopped
    code, out, _ = _run(capsys, "train", str(config), "--no-progress")
    assert code == 0 and out.startswith("Nothing to do: early stopping")
    # the best version is what --version best reads
    code, out, err = _run(
        capsys,
        "eval",
        str(config),
        "--edges",
        str(tmp_path / "valid.tsv"),
        "--version",
        "best",
        "--no-progress",
    )
    assert code == 0, err
    assert "(version 1)" in out.splitlines()[0]
    filtered = next(line for line in out.splitlines() if line.startswith("filtered"))
    assert float(filtered.split()[2]) == pytest.approx(best["value"], abs=1e-4)
    code, out, err = _run(capsys, "similar", str(model), "n1", "-k", "2", "--version", "best")
    assert code == 0, err
    code, out, err = _run(capsys, "plot", str(model))
    assert code == 0, err


def test_resume_continues_the_count_and_every(tmp_path, capsys) -> None:
    config = _setup(tmp_path, patience=2, min_delta=1.0, every=2)
    code, out, err = _run(capsys, "train", str(config), "--no-progress", "-p", "num_epochs=3")
    assert code == 0, err
    # every 2 epochs, and the last epoch: versions 2 and 3
    assert [r["version"] for r in _records(tmp_path)] == [2, 3]
    assert "Stopped early" not in out  # the last epoch: nothing left to stop
    code, out, err = _run(capsys, "train", str(config), "--no-progress")
    assert code == 0, err
    # resumed: 1 evaluation without gain was counted before, one more (epoch 4) stops
    assert [r["version"] for r in _records(tmp_path)] == [2, 3, 4]
    assert "Stopped early" in out
    assert (tmp_path / "model" / "checkpoint_version.txt").read_text().strip() == "4"


def test_gains_reset_the_count_and_move_best(tmp_path, capsys) -> None:
    config = _setup(tmp_path, patience=1, metric="auc", protocol="sampled")
    code, _, err = _run(capsys, "train", str(config), "--no-progress", "-p", "num_epochs=4")
    assert code == 0, err
    records = _records(tmp_path)
    best = max(records, key=lambda r: r["value"])
    assert records[-1]["best_version"] == best["version"]
    kept = json.loads((tmp_path / "model" / "best" / "best.json").read_text())
    assert kept["version"] == best["version"] and kept["protocol"] == "sampled"
    for r in records:
        assert (r["without_gain"] == 0) == (r["version"] == r["best_version"])


def test_refusals(tmp_path, capsys) -> None:
    config = _setup(tmp_path, patience=2)
    # a `best` entry that is not bigembed's is never replaced
    mine = tmp_path / "model" / "best"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    code, _, err = _run(capsys, "train", str(config), "--no-progress", "-p", "num_epochs=1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not bigembed's best-version snapshot" in err
    assert (mine / "notes.txt").read_text() == "mine"
    code, _, err = _run(
        capsys, "train", str(config), "-p", f"early_stopping.valid_path={tmp_path}/nope.tsv"
    )
    assert code == 2 and "early_stopping.valid_path:" in err and len(err.splitlines()) == 1
    code, _, err = _run(capsys, "train", str(config), "-p", "early_stopping.patience=0")
    assert code == 2 and "early_stopping.patience" in err and "config.yaml" in err
    code, _, err = _run(capsys, "eval", str(config), "--version", "best", "--no-progress")
    assert code == 2 and "no best version" in err
    code, _, err = _run(
        capsys,
        "config",
        "show",
        str(config),
        "-p",
        "num_machines=2",
        "-p",
        "distributed_init_method=tcp://127.0.0.1:1",
    )
    assert code == 0, err  # distributed early stopping: tests/test_dist_summaries.py


def test_a_gain_resets_the_count(tmp_path, capsys, monkeypatch) -> None:
    """Scripted validation values: 0.1, 0.05 (1 without gain), 0.2 (gain: count back to 0),
    0.1, 0.1 (2 without gain: stop after epoch 5)."""
    import bigembed.eval as evaluation  # early stopping looks the function up there

    values = iter([0.1, 0.05, 0.2, 0.1, 0.1, 0.1, 0.1])

    class Scripted:
        def __init__(self, value: float) -> None:
            self.headline = {"mrr": value, "hits@10": value}

    monkeypatch.setattr(evaluation, "evaluate_checkpoint", lambda *a, **k: Scripted(next(values)))
    config = _setup(tmp_path, patience=2)
    code, _, err = _run(capsys, "train", str(config), "--no-progress")
    assert code == 0, err
    records = _records(tmp_path)
    assert [r["without_gain"] for r in records] == [0, 1, 0, 1, 2]
    assert [r["best_version"] for r in records] == [1, 1, 3, 3, 3]
    assert json.loads((tmp_path / "model" / "best" / "best.json").read_text())["version"] == 3


def test_one_machine_callers_refuse_a_distributed_config(tmp_path) -> None:
    """A tune trial (observers, on_evaluation) cannot be a rank of a distributed run."""
    from bigembed.config import load_config
    from bigembed.errors import ConfigError
    from bigembed.selection import train_model

    config = _setup(tmp_path)
    cfg = load_config(config, ["num_machines=2", "distributed_init_method=tcp://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="num_machines: 2: only bigembed train --rank R"):
        train_model(cfg, on_evaluation=lambda evaluation: None)
