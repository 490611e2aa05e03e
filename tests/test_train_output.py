"""What ``bigembed train`` prints: per-epoch lines without a terminal, labelled evals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.graphs import tiny_kg_config_file

pytestmark = pytest.mark.integration  # `bigembed train` as a subprocess

ROOT = Path(__file__).resolve().parents[1]


def _config(root: Path, **overrides: object) -> Path:
    path, _ = tiny_kg_config_file(root, 60, 600, num_epochs=2, eval_fraction=0.1, **overrides)
    return path


def _train(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "bigembed.cli", "train", *argv],
        capture_output=True,  # stdout and stderr are pipes, not terminals
        text=True,
        env=env,
        timeout=120,
    )


def test_epoch_lines_print_without_a_terminal_and_say_sampled(tmp_path: Path) -> None:
    config = _config(tmp_path)
    done = _train(str(config), "--no-progress")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"]
    assert all("withheld-edge mrr (sampled)" in line for line in epochs)
    assert any(line.startswith("Withheld-edge eval after the last step (sampled") for line in lines)
    assert "edge/s" not in done.stderr  # no progress bars were drawn
    # progress bars asked for but stdout is a pipe: the summary lines still reach stdout
    done = _train(str(config), "-p", "num_epochs=3")
    assert done.returncode == 0, done.stderr
    assert [
        line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("epoch")
    ] == ["epoch 3/3"]
