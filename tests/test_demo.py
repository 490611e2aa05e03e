"""The README's main job, shrunk: `bigembed demo` end to end on the bundled FB15k-237."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bigembed.cli import main as cli_main

# no process of its own, but the whole demo job on FB15k-237: minutes, not an inner-loop test
pytestmark = pytest.mark.integration


def test_demo_end_to_end(tmp_path: Path, capsys) -> None:
    work = tmp_path / "demo"
    args = [
        "demo",
        "--workdir",
        str(work),
        "--epochs",
        "1",
        "--dimension",
        "16",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "14,541" in out  # entities of FB15k-237
    assert "filtered" in out and "MRR" in out
    report = json.loads((work / "eval_test.json").read_text())
    assert report  # machine-readable results next to the table
    png = work / "training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"Training curves: {png}" in out
    assert "rank" in out and "of 14,541" in out  # example predictions with the true entity's rank
    # a second run reuses the import and the finished checkpoint
    assert cli_main(args) == 0
    again = capsys.readouterr().out
    assert "already imported" in again and "already trained" in again
