"""The best version by default: after early stopping kept one, training's summary names it and
predict, similar, eval, export, convert and ``bigembed.load`` read it, saying so in one line;
``--version latest`` (``version="latest"``) reads the latest. Early stopping itself keeps
evaluating the latest version."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

import bigembed
from bigembed.cli import main as cli_main
from support.graphs import tiny_kg_config_file

try:  # at collection: importing h5py runs `uname`, which a unit test may not
    import h5py
except ImportError:  # pragma: no cover (h5py is an extra)
    h5py = None

BEST, LATEST = 1, 3  # min_delta 1.0: nothing beats the first evaluation; patience 2 stops at 3
NOTE = "using version 1, the best kept by early stopping (validation mrr "


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(config path, training's stdout) of a run that early stopping ended at version 3."""
    root = tmp_path_factory.mktemp("best")
    path, valid = tiny_kg_config_file(
        root, 60, 900, valid=True, num_epochs=10, lr=0.1, eval_fraction=0.0
    )
    data = yaml.safe_load(path.read_text())
    data["early_stopping"] = {"valid_path": str(valid), "patience": 2, "min_delta": 1.0}
    path.write_text(yaml.safe_dump(data))
    out = io.StringIO()  # capsys is per test; the summary is read by one of them
    with contextlib.redirect_stdout(out):
        assert cli_main(["train", str(path), "--no-progress"]) == 0
    return path, out.getvalue()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out, captured.err


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the best kept by early stopping" in line]


def test_the_training_summary_names_the_best_version(stopped) -> None:
    config, out = stopped
    records = (config.parent / "model" / "validation_stats.json").read_text().splitlines()
    assert [json.loads(r)["version"] for r in records] == [1, 2, 3]
    line = next(x for x in out.splitlines() if x.startswith("Best version:"))
    assert line.startswith(f"Best version: {BEST} (validation mrr ")
    assert f"(--version latest for version {LATEST})" in line


def test_early_stopping_evaluated_the_latest_versions(stopped) -> None:
    """Its evaluations are of versions 2 and 3 themselves, not of the best one (the reading
    commands' default must not leak into training's own evaluation)."""
    config, _ = stopped
    records = (config.parent / "model" / "validation_stats.json").read_text().splitlines()
    values = [json.loads(r)["value"] for r in records]
    assert len(set(values)) == 3, values


def test_eval_reads_the_best_by_default(stopped, capsys) -> None:
    config, _ = stopped
    valid = str(config.parent / "valid.tsv")
    argv = ["eval", str(config), "--edges", valid, "--no-progress"]
    out, err = _run(capsys, *argv)
    assert f"(version {BEST})" in out.splitlines()[0]
    (note,) = _notes(err)
    assert note.startswith("bigembed eval: ") and NOTE in note
    assert note.endswith(f"the latest is version {LATEST} (--version latest reads it)")
    out, err = _run(capsys, *argv, "--version", "latest")
    assert f"(version {LATEST})" in out.splitlines()[0] and not _notes(err)
    # reading best/ keeps the whole checkpoint directory an input: no report written into it
    assert cli_main([*argv, "--output", str(config.parent / "model" / "report.json")]) == 2
    assert "lies inside the input" in capsys.readouterr().err


def test_queries_read_the_best_by_default(stopped, capsys) -> None:
    config, _ = stopped
    model = str(config.parent / "model")
    best = bigembed.load(model, version="best")
    latest = bigembed.load(model, version="latest")
    assert (best.trained.version, latest.trained.version) == (BEST, LATEST)
    queries = {
        "predict": (["--lhs", "n1", "--rel", "r0"], lambda m: m.predict("n1", "r0", k=10)),
        "similar": (["n1"], lambda m: m.similar("n1", k=10)),
    }
    for command, (args, api) in queries.items():
        out, err = _run(capsys, command, model, *args, "--json")
        assert [r["name"] for r in json.loads(out)] == [p.name for p in api(best)], command
        assert len(_notes(err)) == 1 and err.startswith(f"bigembed {command}: ")
        out, err = _run(capsys, command, model, *args, "--json", "--version", "latest")
        assert [r["name"] for r in json.loads(out)] == [p.name for p in api(latest)], command
        assert not _notes(err)
    assert [p.name for p in best.similar("n1")] != [p.name for p in latest.similar("n1")]


def test_export_and_convert_read_the_best_by_default(stopped, capsys, tmp_path) -> None:
    config, _ = stopped
    model = str(config.parent / "model")
    _, err = _run(capsys, "export", model, "--format", "npy", "-o", str(tmp_path / "e1"))
    assert json.loads((tmp_path / "e1" / "export.json").read_text())["version"] == BEST
    assert len(_notes(err)) == 1
    argv = ["export", model, "--format", "npy", "-o", str(tmp_path / "e2"), "--version", "latest"]
    _, err = _run(capsys, *argv)
    assert json.loads((tmp_path / "e2" / "export.json").read_text())["version"] == LATEST
    assert not _notes(err)
    # reading best/ keeps the whole checkpoint directory an input: nothing written into it
    assert cli_main(["export", model, "--format", "npy", "-o", f"{model}/e"]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    if h5py is None:
        pytest.skip("convert needs h5py")
    assert cli_main(["convert", "to-pbg", model, "-", f"{model}/pbg", str(tmp_path / "x")]) == 2
    assert "lies inside the input" in capsys.readouterr().err
    for version, expected in ((None, BEST), ("latest", LATEST), ("best", BEST)):
        out_dir = tmp_path / f"pbg_{version}"
        argv = ["convert", "to-pbg", model, "-", str(out_dir / "ck"), str(out_dir / "ent")]
        out, err = _run(capsys, *argv, *(["--version", version] if version else []))
        assert out.startswith(f"Converted version {expected} ")
        assert (out_dir / "ck" / "checkpoint_version.txt").read_text().strip() == str(expected)
        assert len(_notes(err)) == (1 if version is None else 0)


def test_the_python_api_loads_the_best_by_default(stopped, caplog) -> None:
    config, _ = stopped
    model = config.parent / "model"
    with caplog.at_level(logging.INFO, logger="bigembed.serving"):
        assert bigembed.load(model).trained.version == BEST
    (note,) = [r.getMessage() for r in caplog.records if NOTE in r.getMessage()]
    assert "(version='latest' reads it)" in note
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bigembed.serving"):
        assert bigembed.load(model, version="latest").trained.version == LATEST
    assert not [r for r in caplog.records if NOTE in r.getMessage()]


def test_no_best_no_note(trained_checkpoint, capsys) -> None:
    """A checkpoint trained without early stopping reads its latest version, silently."""
    path = trained_checkpoint.config.checkpoint_path
    out, err = _run(capsys, "similar", path, "n1", "-k", "2")
    assert "early stopping" not in err and out.startswith("Nearest to n1")


def test_a_best_beyond_the_latest_is_not_used(stopped, tmp_path) -> None:
    """best/ recording a version after the committed one (left from an earlier run) is not
    the best of this one: the latest is read, and the note says why."""
    from bigembed.checkpoints import choose_version

    config, _ = stopped
    model = tmp_path / "model"
    shutil.copytree(config.parent / "model", model)
    record = json.loads((model / "best" / "best.json").read_text())
    (model / "best" / "best.json").write_text(json.dumps({**record, "version": 99}))
    chosen = choose_version(model)
    assert chosen.directory == model and not chosen.latest_differs
    assert chosen.note is not None and f"using the latest version {LATEST}" in chosen.note
    assert bigembed.load(model).trained.version == LATEST
