"""The docs' commands, run as written: README's quickstart and docs/tutorial_csv.md.

Every command of the README's marked ```bash block and of the tutorial's ```bash blocks runs in
order in a scratch directory. Only training is cut (fewer epochs, and for FB15k-237 a smaller
dimension and fewer negatives) to keep the test short; everything else is the pages' text, so
the docs cannot drift from what the commands do.
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
README = ROOT / "README.md"
QUICKSTART_MARK = "<!-- tests/test_tutorial_csv.py runs the next block"


def _commands(blocks: list[str]) -> list[list[str]]:
    out = []
    for block in blocks:
        text = block.replace("\\\n", " ")
        out += [shlex.split(line, comments=True) for line in text.splitlines()]
    return [argv for argv in out if argv]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _run(commands: list[list[str]], extra: dict[str, list[str]], capsys) -> list[tuple]:
    """Run each command in-process (``python`` in a child); (argv, stdout) of each."""
    done = []
    for argv in commands:
        if argv[0] == "python":
            subprocess.run([sys.executable, *argv[1:]], check=True, capture_output=True)
            continue
        assert argv[0] == "bigembed", argv
        run = [*argv[1:], *extra.get(argv[1], [])]
        code = cli_main(run)
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err)
        done.append((argv, captured.out))
    return done


def _names(commands: list[list[str]]) -> list[str]:
    return [c[1] if c[0] == "bigembed" else c[0] for c in commands]


@pytest.mark.integration
def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    commands = _commands(_bash_blocks(PAGE.read_text(encoding="utf-8")))
    assert _names(commands) == [
        "python",
        "init",
        "import",
        "train",
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
    cut = {"train": ["-p", "num_epochs=3", "--no-progress"], "eval": ["--no-progress"]}
    done = _run(commands, cut, capsys)
    first = {argv[1]: out for argv, out in reversed(done)}
    outputs = {argv[1]: out for argv, out in done}
    # section 2: init's config imports and trains as it is
    assert first["init"].startswith("Wrote work/quick/friends.yaml for friends.csv (5,049 edges")
    assert "relations: 2 listed" in first["init"]
    assert "relation types: 2" in first["import"] and "(from friends.csv)" in first["import"]
    assert (tmp_path / "work/quick/friends/model").is_dir()
    # the rest: split, held-out edges, early stopping, queries
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


def _quickstart() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    assert text.count(QUICKSTART_MARK) == 1
    return _commands(_bash_blocks(text.split(QUICKSTART_MARK, 1)[1])[:1])


@pytest.mark.integration
def test_the_readme_quickstart_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    commands = _quickstart()
    assert _names(commands) == [
        "datasets",
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
    small = [
        *("-p", "num_epochs=1", "-p", "dimension=16", "-p", "workers=1"),
        *("-p", "num_uniform_negs=10", "-p", "num_batch_negs=10", "--no-progress"),
    ]
    done = dict((argv[1], out) for argv, out in _run(commands, {"train": small}, capsys))
    assert "entities all: 14,541" in done["import"]
    assert "edges work/fb15k237/test: 20,466" in done["import"]
    assert "Trained 1 step(s)" in done["train"]
    assert (tmp_path / "work/fb15k237/model/training.png").exists() or "png" in done["plot"]
    assert "filtered" in done["eval"]
    assert (tmp_path / "work/fb15k237/export").is_dir()
    assert "/m/027rn" in done["predict"] and "/m/027rn" in done["similar"]


@pytest.mark.parametrize("name", ["tutorial_csv.md", "tuning.md"])
def test_docs_are_linked_from_the_readme(name: str) -> None:
    assert f"docs/{name}" in README.read_text(encoding="utf-8")
