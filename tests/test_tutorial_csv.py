"""docs/tutorial_csv.md, run as written: every command of its ```bash blocks, in order.

Only the number of epochs is cut (``-p num_epochs=3``) to keep the test short; everything else
is the page's text, so the tutorial cannot drift from what the commands do.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bigembed.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorial_csv.md"


def _commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    out = []
    for block in blocks:
        text = block.replace("\\\n", " ")
        out += [shlex.split(line) for line in text.splitlines() if line.strip()]
    return out


@pytest.mark.integration
def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    commands = _commands()
    assert [c[1] if c[0] == "bigembed" else c[0] for c in commands] == [
        "python",
        "split",
        "import",
        "train",
        "plot",
        "eval",
        "export",
        "predict",
        "similar",
    ]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for argv in commands:
        if argv[0] == "python":
            subprocess.run([sys.executable, *argv[1:]], check=True, capture_output=True)
            continue
        assert argv[0] == "bigembed"
        if argv[1] == "train":
            argv = [*argv, "-p", "num_epochs=3", "--no-progress"]
        if argv[1] == "eval":
            argv = [*argv, "--no-progress"]
        code = cli_main(argv[1:])
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err)
        outputs[argv[1]] = captured.out
    assert "train 4,039 (80.0%), valid 505 (10.0%), test 505 (10.0%)" in outputs["split"]
    assert "entities person: 400" in outputs["import"]
    assert "validation after epoch 3 (filtered, full ranking)" in outputs["train"]
    assert (tmp_path / "work/friends/model/best/best.json").exists()
    assert outputs["eval"].startswith("Evaluation of work/friends/model/best (version ")
    assert "filtered against 5,049 known edges" in outputs["eval"]
    filtered = next(line for line in outputs["eval"].splitlines() if line.startswith("filtered"))
    assert float(filtered.split()[2]) > 0.05  # learned something in 3 epochs (random: ~0.02)
    assert (tmp_path / "work/friends/export/entities.tsv").exists()
    predicted = [line.split()[1] for line in outputs["predict"].splitlines()[2:]]
    assert len(predicted) == 5
    similar = [line.split()[1] for line in outputs["similar"].splitlines()[2:]]
    assert len(similar) == 5 and "person_03_04" not in similar


@pytest.mark.parametrize("name", ["tutorial_csv.md", "tuning.md"])
def test_docs_are_linked_from_the_readme(name: str) -> None:
    assert f"docs/{name}" in (ROOT / "README.md").read_text(encoding="utf-8")
