"""One writer per directory, with real processes: two trainings on one checkpoint, a killed
holder, an import under a training, each writing command against a holder, readers while a
training commits.

A training that must stay inside its run while the test acts is stopped with SIGSTOP once it
holds its lock (and continued after), so nothing depends on how fast it trains.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bigembed.cli import main as cli_main
from bigembed.config import ConfigSchema
from bigembed.writer_lock import holders, lock_file
from support.graphs import graph_config, save_config, write_graph

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
HOLD = (
    "import signal, sys\nfrom bigembed.writer_lock import hold\n"
    "with hold(sys.argv[1], 'training'):\n    print('held', flush=True)\n    signal.pause()\n"
)


def _setup(
    tmp_path: Path, num_partitions: int = 1, num_edges: int = 6000, **overrides: object
) -> tuple[ConfigSchema, Path]:
    write_graph(tmp_path, num_entities=300, num_edges=num_edges, num_partitions=num_partitions)
    cfg = graph_config(tmp_path, num_partitions=num_partitions, **overrides)
    return cfg, save_config(tmp_path, cfg)


def _bigembed(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bigembed.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_hold(proc: subprocess.Popen[str], target: Path, timeout: float = 120) -> None:
    """Until ``proc`` holds ``target`` (its record is in the lock file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["pid"] == proc.pid for r in holders(target)):
            return
        assert proc.poll() is None, f"it ended first: {proc.communicate()}"
        time.sleep(0.005)
    pytest.fail(f"{target} not held within {timeout}s")


def _stopped_training(config: Path, cfg: ConfigSchema) -> subprocess.Popen[str]:
    """A training stopped inside its run: it holds its checkpoint and reads its stores."""
    proc = _bigembed("train", "--no-progress", str(config))
    _wait_for_hold(proc, Path(cfg.edge_paths[-1]))  # the last of its holds
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def test_second_training_on_one_checkpoint_is_refused_and_the_first_completes(
    tmp_path: Path,
) -> None:
    cfg, config = _setup(tmp_path, num_epochs=3)
    ck = Path(cfg.checkpoint_path)
    first = _stopped_training(config, cfg)
    try:
        before = sorted(p.name for p in ck.iterdir()) if ck.exists() else []
        second = subprocess.run(
            [sys.executable, "-m", "bigembed.cli", "train", "--no-progress", str(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"bigembed train: error: {ck}: being written by training: ")
        assert f"bigembed train --no-progress {config} (pid {first.pid} on " in lines[0]
        assert "started 20" in lines[0] and "Trained" not in second.stdout
        assert (sorted(p.name for p in ck.iterdir()) if ck.exists() else []) == before
    finally:
        code, out, err = _finish(first)
    assert code == 0, err
    assert "Trained 3 step(s) to checkpoint version 3" in out
    assert not lock_file(ck).exists()


def test_a_killed_holders_lock_is_taken_over(tmp_path: Path, capsys) -> None:
    cfg, config = _setup(tmp_path, num_epochs=3)
    ck = Path(cfg.checkpoint_path)
    first = _bigembed("train", "--no-progress", str(config))
    _wait_for_hold(first, ck)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    assert lock_file(ck).exists() and holders(ck) == []  # its record stays; it is dead
    assert cli_main(["train", "--no-progress", str(config)]) == 0
    assert "to checkpoint version 3" in capsys.readouterr().out
    assert not lock_file(ck).exists()


def test_import_over_stores_a_training_reads_is_refused(tmp_path: Path, capsys) -> None:
    cfg, config = _setup(tmp_path, num_epochs=3)
    edges = tmp_path / "edges.tsv"
    edges.write_text("n1\tr0\tn2\nn2\tr1\tn3\n")
    manifest = (Path(cfg.entity_path) / "manifest.json").read_bytes()
    training = _stopped_training(config, cfg)
    try:
        code = cli_main(["import", "--no-progress", "--force", str(config), str(edges)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err
        assert err.startswith(f"bigembed import: error: {cfg.entity_path}: read by training: ")
        assert f"(pid {training.pid} on " in err
        assert (Path(cfg.entity_path) / "manifest.json").read_bytes() == manifest
    finally:
        code, _out, err = _finish(training)
    assert code == 0, err
    # once the training ended the import may replace the store (other names: --allow-orphans)
    argv = ["import", "--no-progress", "--force", "--allow-orphans", str(config), str(edges)]
    assert cli_main(argv) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[ConfigSchema, Path]:
    root = tmp_path_factory.mktemp("trained")
    cfg, config = _setup(root, num_epochs=1)
    assert cli_main(["train", "--no-progress", str(config)]) == 0
    return cfg, config


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Path]:
    """A directory held by another process (a stand-in for a running writer)."""
    target = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield target
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "command", ["export", "eval", "tune", "convert", "import", "train", "train --rank 0"]
)
def test_every_writing_command_is_refused_while_its_output_is_held(
    command: str, trained: tuple[ConfigSchema, Path], holder: Path, capsys
) -> None:
    cfg, config = trained
    ck, out = cfg.checkpoint_path, str(holder)
    argv = {
        "export": ["export", ck, "--format", "tsv", "-o", out],
        "eval": ["eval", str(config), "--no-progress", "--output", out],
        "tune": ["tune", str(config), "-o", out, "--n-trials", "1"],
        "convert": ["convert", "to-pbg", ck, "-", out, str(holder.parent / "pbg_entities")],
        "import": ["import", str(config), "-p", f"entity_path={out}", "/nonexistent.tsv"],
        "train": ["train", str(config), "-p", f"checkpoint_path={out}", "--no-progress"],
        "train --rank 0": [  # refused before it opens the rendezvous
            "train",
            str(config),
            "--rank",
            "0",
            "-p",
            f"checkpoint_path={out}",
            "-p",
            "num_machines=2",
            "-p",
            "distributed_init_method=tcp://127.0.0.1:9",
            "--no-progress",
        ],
    }[command]
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    name = command.split()[0]
    assert err.startswith(f"bigembed {name}: error: {out}: being written by training: "), err
    assert not holder.exists() and not (holder.parent / "pbg_entities").exists()


def test_readers_see_committed_versions_while_a_training_commits(tmp_path: Path) -> None:
    """Queries, export and eval read one committed version each, never a half-replaced one."""
    from bigembed.serving import load

    cfg, config = _setup(tmp_path, num_epochs=12, num_partitions=2, num_edges=1000)
    ck = Path(cfg.checkpoint_path)
    assert cli_main(["train", "--no-progress", str(config), "-p", "num_epochs=1"]) == 0
    training = _bigembed("train", "--no-progress", str(config))
    versions: set[int] = set()
    try:
        for n in itertools.count():
            if training.poll() is not None:
                break
            model = load(ck)
            time.sleep(0.01)  # a commit may delete this version's files now
            vectors = model.vectors(model.entity_names("node"), "node")
            assert vectors.shape == (300, 16) and np.isfinite(vectors).all()
            versions.add(model.trained.version)
            out = tmp_path / f"export_{n}"
            assert cli_main(["export", str(ck), "--format", "npy", "-o", str(out)]) == 0
    finally:
        _out, err = training.communicate(timeout=300)
    assert training.returncode == 0, err
    assert len(versions) > 3, versions
