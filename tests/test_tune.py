"""``bigembed tune`` on a tiny graph: trials, pruning, best config, resume, refusals."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from bigembed.checkpoints import CheckpointStore
from bigembed.cli import main as cli_main
from bigembed.config import load_config
from support.graphs import tiny_kg_config_file

optuna = pytest.importorskip("optuna")


def _setup(root: Path, **tune: object) -> Path:
    path, valid = tiny_kg_config_file(root, 40, 400, valid=True, num_epochs=3, eval_fraction=0.0)
    data = yaml.safe_load(path.read_text())
    data["early_stopping"] = {"valid_path": str(valid), "patience": 2}
    data["tune"] = {
        "n_trials": 3,
        "startup_trials": 1,
        "params": {
            "lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True},
            "dimension": {"type": "categorical", "choices": [4, 8]},
        },
        **tune,
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _results(out_dir: Path) -> list[dict[str, str]]:
    with open(out_dir / "results.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_tune_runs_trials_writes_best_config_and_resumes(tmp_path, capsys) -> None:
    config = _setup(tmp_path)
    out_dir = tmp_path / "tune"
    # the user's own checkpoint_path already holds a model of another shape (issue 26)
    argv = ["train", str(config), "--no-progress", "-p", "dimension=16", "-p", "num_epochs=1"]
    assert _run(capsys, *argv)[0] == 0
    own = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir() if p.is_file()}
    code, out, err = _run(capsys, "tune", str(config), "-o", str(out_dir), "--n-trials", "2")
    assert code == 0, err
    assert "trial 0 (1/2): dimension=" in out and "validation after epoch 1" in out
    assert "edge/s" in err  # each trial's training draws its progress bars
    assert "2 trial(s) (2 run now)" in out
    rows = _results(out_dir)
    assert [r["trial"] for r in rows] == ["0", "1"]
    assert all(r["state"] in ("complete", "pruned") for r in rows)
    complete = [r for r in rows if r["state"] == "complete"]
    best_row = max(complete, key=lambda r: float(r["mrr"]))
    # the best config: the best trial's values and its checkpoint, ready to train
    best = load_config(out_dir / "best_config.yaml")
    assert best.lr == pytest.approx(float(best_row["lr"]))
    assert best.dimension == int(best_row["dimension"])
    trial_model = out_dir / f"trial_{best_row['trial']}" / "model"
    assert best.checkpoint_path == str(trial_model) and best.tune is None
    assert f"its model is {trial_model}" in out and f"bigembed train {out_dir}" in out
    assert best.early_stopping is not None
    assert (out_dir / f"trial_{best_row['trial']}" / "model" / "best" / "best.json").exists()
    # resumed: the two finished trials are kept, one more runs
    code, out, err = _run(capsys, "tune", str(config), "-o", str(out_dir), "--no-progress")
    assert code == 0, err
    assert "3 trial(s) (1 run now)" in out
    assert "edge/s" not in err
    assert [r["trial"] for r in _results(out_dir)] == ["0", "1", "2"]
    # and `bigembed train` on the best config reuses exactly the model the study found (the
    # user's own checkpoint_path, which may hold a model of another shape, is not touched)
    best = load_config(out_dir / "best_config.yaml")
    store = CheckpointStore(best.checkpoint_path)
    version, files = store.committed_version(), sorted(p.name for p in store.path.iterdir())
    code, out, err = _run(capsys, "train", str(out_dir / "best_config.yaml"), "--no-progress")
    assert code == 0, err
    assert out.startswith("Nothing to do:") and "error" not in err
    assert store.committed_version() == version
    assert sorted(p.name for p in store.path.iterdir()) == files
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir() if p.is_file()} == own


def test_bad_trials_are_pruned_and_interrupted_ones_rerun(tmp_path, capsys) -> None:
    # lr 0 learns nothing: after the first trial sets the median, such a trial is pruned
    config = _setup(
        tmp_path,
        n_trials=2,
        sampler="random",
        params={"lr": {"type": "categorical", "choices": [0.2, 0.0]}},
    )
    out_dir = tmp_path / "tune"
    out_dir.mkdir()
    from bigembed.output_paths import write_marker

    write_marker(out_dir, "tune")
    study = optuna.create_study(
        study_name="bigembed",
        storage=f"sqlite:///{out_dir / 'study.db'}",
        direction="maximize",
    )
    study.enqueue_trial({"lr": 0.2})
    study.enqueue_trial({"lr": 0.0})
    code, out, err = _run(capsys, "tune", str(config), "-o", str(out_dir))
    assert code == 0, err
    rows = _results(out_dir)
    assert [(r["state"], r["lr"]) for r in rows] == [("complete", "0.2"), ("pruned", "0.0")]
    assert "pruned after epoch 1" in rows[1]["note"]
    # a trial left running by a killed process: closed as failed, its parameters run again
    study.enqueue_trial({"lr": 0.2})
    killed = study.ask()
    killed.suggest_categorical("lr", [0.2, 0.0])
    code, out, err = _run(capsys, "tune", str(config), "-o", str(out_dir), "--n-trials", "3")
    assert code == 0, err
    assert f"trial {killed.number}: interrupted earlier; its parameters run again" in out
    rows = _results(out_dir)
    assert [r["state"] for r in rows][2] == "failed" and rows[2]["note"] == "interrupted"
    assert len(rows) == 4 and rows[3]["lr"] == rows[2]["lr"]  # not counted: 3 trials + it
    rerun = optuna.load_study(study_name="bigembed", storage=f"sqlite:///{out_dir / 'study.db'}")
    assert rerun.trials[3].system_attrs.get("fixed_params") == {"lr": 0.2}  # queued, not drawn


def test_tune_refusals(tmp_path, capsys) -> None:
    config = _setup(tmp_path)
    cases = [
        (["-p", "tune=null"], "tune: missing"),
        (["-p", "early_stopping=null"], "early_stopping: missing"),
        (["-p", 'tune.params={"nope": {"type": "int", "low": 1, "high": 2}}'], "unknown key"),
        (["-p", 'tune.params={"lr": {"type": "float", "low": 2, "high": 1}}'], "low <= high"),
        (["-p", 'tune.params={"lr": {"type": "categorical"}}'], "choices"),
    ]
    for extra, words in cases:
        code, _, err = _run(capsys, "tune", str(config), "-o", str(tmp_path / "t"), *extra)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (extra, err)
        assert "config.yaml" in err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x.txt").write_text("mine")
    code, _, err = _run(capsys, "tune", str(config), "-o", str(mine))
    assert code == 2 and "not a bigembed tune directory" in err
    code, _, err = _run(capsys, "tune", str(config), "-o", str(tmp_path / "edges" / "t"))
    assert code == 2 and "lies inside the input" in err
    assert not (tmp_path / "t").exists()
