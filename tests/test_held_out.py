"""No silent training on held-out edges: the warning of ``bigembed train``, and PBG's FB15k
example config used as PBG's example script uses it (train on the first edge path, evaluate
on the test path), with the commands of its header run as written."""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from bigembed.checkpoints import CheckpointStore
from bigembed.cli import main as cli_main
from bigembed.config import held_out_warnings, load_config
from bigembed.config.held_out import held_out_word
from support.graphs import graph_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fb15k_config.py"
# the example at its PBG size is far too slow for a test; the semantics do not depend on it
SMALL = ["-p", "dimension=8", "-p", "num_epochs=1", "-p", "num_uniform_negs=10", "-p", "workers=1"]


@pytest.mark.parametrize(
    ("name", "word"),
    [
        ("data/valid.tsv", "valid"),
        ("data/FB15k/freebase_mtr100_mte100-test_partitioned", "test"),
        ("work/x/held_out", "held_out"),
        ("heldout.parquet", "heldout"),
        ("splits/dev.txt", "dev"),
        ("edges_val", "val"),
        ("Validation-Edges.csv", "validation"),
        ("work/fb15k237/train", None),
        ("test/project/edges", None),  # only the path's own name counts
        ("latest", None),
        ("interval_edges", None),
        ("contest.tsv", None),
        ("devices", None),
        ("freebase_mtr100_mte100-train_partitioned", None),
    ],
)
def test_held_out_names(name: str, word: str | None) -> None:
    assert held_out_word(name) == word


def test_warnings_name_the_path_and_why(tmp_path: Path) -> None:
    train, valid = str(tmp_path / "edges"), str(tmp_path / "valid_set")
    assert held_out_warnings(graph_config(tmp_path, edge_paths=[train])) == []
    # the early-stopping set trained on (by another spelling of its path), and a "test" path
    stop = {"valid_path": str(tmp_path / "x" / ".." / "edges")}
    test = str(tmp_path / "fb-test_partitioned")
    cfg = graph_config(tmp_path, edge_paths=[train, test], early_stopping=stop)
    lines = held_out_warnings(cfg)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"edge_paths[0] {train}: training on the validation edges")
    assert "early_stopping.valid_path" in lines[0]
    assert lines[1].startswith(f"edge_paths[1] {test}: ") and "('test')" in lines[1]
    assert all("-p edge_paths=" in line and "\n" not in line for line in lines)
    # a validation set that is not trained on: no warning
    cfg = graph_config(tmp_path, edge_paths=[train], early_stopping={"valid_path": valid})
    assert held_out_warnings(cfg) == []


def _write_fb15k(root: Path) -> dict[str, int]:
    """Tiny stand-ins for PBG's FB15k files under ``root/data/FB15k``; returns edges per split."""
    rng = np.random.default_rng(0)
    sizes = {"train": 400, "valid": 40, "test": 40}
    folder = root / "data" / "FB15k"
    folder.mkdir(parents=True)
    for split, n in sizes.items():
        heads, rels = rng.integers(0, 50, n), rng.integers(0, 3, n)
        rows = zip(heads, rels, (heads * (rels + 2)) % 50, strict=True)
        text = "".join(f"/m/{h}\t/r/{r}\t/m/{t}\n" for h, r, t in rows)
        (folder / f"freebase_mtr100_mte100-{split}.txt").write_text(text)
    return sizes


def _header_commands() -> list[list[str]]:
    """The example's commands, as its docstring writes them ($D expanded)."""
    doc = EXAMPLE.read_text().split('"""')[1]
    (value,) = re.findall(r"^  D=(\S+)$", doc, re.M)
    lines = re.findall(r"^  bigembed (.+)$", doc, re.M)
    return [shlex.split(line.replace("$D", value)) for line in lines]


def test_pbg_example_trains_on_the_first_path_and_evaluates_on_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, caplog
) -> None:
    sizes = _write_fb15k(tmp_path)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    pbg = load_config(EXAMPLE)  # as PBG ships it: train, valid, test
    assert [p.rsplit("-", 1)[1] for p in pbg.edge_paths] == [
        "train_partitioned",
        "valid_partitioned",
        "test_partitioned",
    ]
    commands = _header_commands()
    assert [c[0] for c in commands] == ["import", "train", "eval"]
    imp, train, evaluate = commands
    assert cli_main(imp) == 0
    caplog.set_level(logging.WARNING)
    assert cli_main([*train, "--no-progress", *SMALL]) == 0
    assert not [r for r in caplog.records if "held out" in r.getMessage()]
    model = Path(pbg.checkpoint_path)
    steps = [r for r in CheckpointStore(model).read_stats() if r["type"] == "step"]
    assert [s["edge_path_idx"] for s in steps] == [0]  # one epoch, one edge path
    assert steps[0]["stats"]["count"] == sizes["train"]
    assert json.loads((model / "config.json").read_text())["edge_paths"] == [pbg.edge_paths[0]]
    capsys.readouterr()
    assert cli_main([*evaluate, "--no-progress", *SMALL]) == 0
    out = capsys.readouterr().out
    assert f"edges: {sizes['test']} from {pbg.edge_paths[2]}" in out, out
    filters = next(line for line in out.splitlines() if "filtered against" in line)
    assert all(path in filters for path in pbg.edge_paths), out  # PBG's script's filters


def test_train_warns_once_per_held_out_path(tmp_path: Path, monkeypatch, caplog) -> None:
    """The example as it is (no -p edge_paths): two warnings, for valid and test."""
    _write_fb15k(tmp_path)
    monkeypatch.chdir(tmp_path)
    imp = _header_commands()[0]
    assert cli_main([imp[0], str(EXAMPLE), *imp[2:]]) == 0
    caplog.set_level(logging.WARNING)
    assert cli_main(["train", str(EXAMPLE), "--no-progress", *SMALL]) == 0
    warned = [r.getMessage() for r in caplog.records if "held out" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "valid_partitioned" in warned[0] and "('valid')" in warned[0]
    assert "test_partitioned" in warned[1] and "('test')" in warned[1]
