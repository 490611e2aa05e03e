"""``bigembed eval`` end to end on a tiny trained model; errors on bad input and checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bigembed.checkpoints import VERSION_FILE
from bigembed.cli import main as cli_main
from bigembed.eval import evaluate_checkpoint
from support.checkpoints import TrainedRing, write_config_file


@pytest.fixture(scope="module")
def model(trained_checkpoint: TrainedRing):
    return (
        trained_checkpoint.root,
        trained_checkpoint.config,
        trained_checkpoint.edges,
        trained_checkpoint.config_file,
    )


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_eval_writes_table_and_json(model, tmp_path: Path, capsys) -> None:
    root, _, edges, config = model
    out = tmp_path / "report.json"
    rc = cli_main(
        [
            "eval",
            str(config),
            "--edges",
            str(root / "test"),
            "--per-relation",
            "--output",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "protocol: full ranking" in table and "filtered" in table and "far" in table
    report = json.loads(out.read_text())
    assert report["protocol"] == "full"
    assert report["num_edges"] == len(edges)
    assert report["overall"]["raw"]["count"] == 2 * len(edges)
    # the model memorised the ring: every filtered rank is 1
    assert report["overall"]["filtered"]["mrr"] == pytest.approx(1.0)
    assert report["overall"]["filtered"]["auc"] == pytest.approx(1.0)
    assert {r["relation"] for r in report["per_relation"]} == {"far", "next"}
    assert all(r["filtered"]["hits@1"] == 1.0 for r in report["per_relation"])


def test_file_of_names_gives_the_same_numbers(model, tmp_path: Path) -> None:
    root, cfg, edges, _ = model
    tsv = tmp_path / "test.tsv"
    tsv.write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in edges))
    from_store = evaluate_checkpoint(cfg, [root / "test"])
    from_file = evaluate_checkpoint(cfg, [tsv])
    assert from_file.overall == from_store.overall
    assert from_file.inputs[0]["kind"] == "file"


def test_unknown_names_name_file_and_line_or_are_skipped(model, tmp_path: Path, capsys) -> None:
    _, _, edges, config = model
    tsv = tmp_path / "bad.tsv"
    lines = [f"{h}\t{r}\t{t}" for h, r, t in edges[:3]]
    lines[1:1] = ["n1\tnext\tnobody", "n1\tunknown_rel\tn2"]
    tsv.write_text("\n".join(lines) + "\n")
    rc = cli_main(["eval", str(config), "--edges", str(tsv), "--no-progress"])
    assert rc == 2
    line = _err_line(capsys)
    assert f"{tsv}:2:" in line and "'nobody'" in line and "--skip-unknown" in line
    rc = cli_main(
        [
            "eval",
            str(config),
            "--edges",
            str(tsv),
            "--skip-unknown",
            "--no-progress",
            "--output",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["edges"][0]["skipped"] == 2 and report["num_edges"] == 3
    assert "unknown relation 'unknown_rel'" in report["notes"][0]


def test_a_line_of_the_wrong_width_names_file_and_line(model, tmp_path: Path, capsys) -> None:
    _, _, edges, config = model
    tsv = tmp_path / "short.tsv"
    lines = [f"{h}\t{r}\t{t}" for h, r, t in edges[:4]]
    lines[2] = "n1\tnext"  # line 3 has 2 columns
    tsv.write_text("\n".join(lines) + "\n")
    rc = cli_main(["eval", str(config), "--edges", str(tsv), "--no-progress"])
    assert rc == 2
    assert f"{tsv}:3: has 2 column(s), the first line has 3" in _err_line(capsys)


def test_raw_only_and_sampled_protocol(model, tmp_path: Path) -> None:
    root, cfg, _, _ = model
    raw = evaluate_checkpoint(cfg, [root / "test"], filtered=False)
    assert raw.overall["filtered"] is None and not raw.filtered
    sampled = evaluate_checkpoint(cfg, [root / "test"], protocol="sampled")
    data = json.loads(sampled.json_text())
    assert data["protocol"] == "sampled" and data["overall"]["filtered"] is None
    assert "sampled" in sampled.table().splitlines()[0]
    assert 0 < data["overall"]["raw"]["mrr"] <= 1 and data["loss"] > 0


def test_missing_default_filter_set_is_a_clear_error(model, tmp_path: Path) -> None:
    root, cfg, _, _ = model
    moved = cfg.model_copy(update={"edge_paths": [str(tmp_path / "gone")]})
    with pytest.raises(Exception, match="--filter-edges"):
        evaluate_checkpoint(moved, [root / "test"])


@pytest.mark.parametrize("breakage", ["no_dir", "no_version", "no_embeddings", "bad_metadata"])
def test_broken_checkpoint_is_one_line_naming_the_path(
    model, tmp_path: Path, capsys, breakage: str
) -> None:
    import shutil

    root, cfg, _, _ = model
    ck = tmp_path / "ck"
    if breakage != "no_dir":
        shutil.copytree(cfg.checkpoint_path, ck)
    if breakage == "no_version":
        (ck / VERSION_FILE).unlink()
    elif breakage == "no_embeddings":
        for p in ck.glob("embeddings_*"):
            p.unlink()
    elif breakage == "bad_metadata":
        for p in ck.glob("metadata.*"):
            p.write_text("{not json")
    broken = cfg.model_copy(update={"checkpoint_path": str(ck)})
    config = write_config_file(broken, tmp_path / "broken.json")
    for argv in (
        ["eval", str(config), "--edges", str(root / "test"), "--no-progress"],
        ["export", str(ck), "--format", "npy", "--output", str(tmp_path / "x")],
        ["similar", str(ck), "n1"],
    ):
        assert cli_main(argv) == 2
        line = _err_line(capsys)
        assert str(ck) in line, line
        if breakage == "no_version":
            assert VERSION_FILE in line
        if breakage == "no_embeddings":
            assert "embeddings_node_0" in line


def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bigembed.cli", *argv], capture_output=True, text=True, timeout=120
    )


@pytest.mark.integration
def test_failing_eval_exits_cleanly_every_time(model, tmp_path: Path) -> None:
    """A bad input is exit status 2 and one line, never an abort at exit (status 134): Arrow's
    read-ahead threads must have let go of every Python object before the interpreter ends."""
    _, _, edges, config = model
    malformed = tmp_path / "malformed.tsv"
    malformed.write_text("\n".join(["\t".join(edges[0]), "only_one_column", "\t".join(edges[1])]))
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text("n1\tnext\tnobody\n")
    cases = [(malformed, f"{malformed}:2: has 1 column(s)")] * 5 + [
        (unknown, f"{unknown}:1: unknown rhs entity 'nobody'"),
        (tmp_path / "missing.tsv", "no such edge path or edge file"),
    ]
    for path, message in cases:
        out = _run_cli("eval", str(config), "--edges", str(path), "--no-progress")
        assert out.returncode == 2, out.stderr
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bigembed eval: error: "), out.stderr
        assert message in lines[0]


def test_rel_col_means_the_same_in_import_and_eval(model, tmp_path: Path, capsys) -> None:
    from bigembed.cli import build_parser

    parser = build_parser()
    for value, expected in (
        ("none", None),
        ("NONE", None),
        ("-", None),
        ("-1", None),
        ("2", 2),
        ("relation", "relation"),
    ):
        got = [
            parser.parse_args([cmd, "c.yaml", "x.tsv", "--rel-col", value]).rel_col
            if cmd == "import"
            else parser.parse_args([cmd, "c.yaml", "--rel-col", value]).rel_col
            for cmd in ("import", "eval")
        ]
        assert got == [expected, expected], value
    for cmd in (["import", "c.yaml", "x.tsv"], ["eval", "c.yaml"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*cmd, "--lhs-col", "-2"])
        assert "negative" in capsys.readouterr().err
    # the model has two relations: a file without a relation column cannot say which
    _, _, edges, config = model
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{h}\t{t}\n" for h, _, t in edges))
    rc = cli_main(
        [
            "eval",
            str(config),
            "--edges",
            str(tsv),
            "--rel-col",
            "none",
            "--rhs-col",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 2
    line = _err_line(capsys)
    assert str(tsv) in line and "no relation column" in line and "2 relations" in line
