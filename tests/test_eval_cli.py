"""``bigembed eval`` end to end on a tiny trained model; errors on bad input and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bigembed.cli import main as cli_main
from bigembed.eval.report import evaluate_checkpoint
from bigembed.train.checkpoint import VERSION_FILE
from evalkit import trained_graph, write_config_file


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("evalcli")
    cfg, edges = trained_graph(root)
    return root, cfg, edges, write_config_file(cfg, root / "config.json")


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_eval_writes_table_and_json(model, tmp_path: Path, capsys) -> None:
    root, _, edges, config = model
    out = tmp_path / "report.json"
    rc = cli_main(["eval", str(config), "--edges", str(root / "test"), "--per-relation",
                   "--output", str(out), "--no-progress"])
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
    rc = cli_main(["eval", str(config), "--edges", str(tsv), "--skip-unknown", "--no-progress",
                   "--output", str(tmp_path / "r.json")])
    assert rc == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["edges"][0]["skipped"] == 2 and report["num_edges"] == 3
    assert "unknown relation 'unknown_rel'" in report["notes"][0]


def test_raw_only_and_sampled_protocol(model, tmp_path: Path) -> None:
    root, cfg, _, _ = model
    raw = evaluate_checkpoint(cfg, [root / "test"], filtered=False)
    assert raw.overall["filtered"] is None and not raw.filtered
    sampled = evaluate_checkpoint(cfg, [root / "test"], protocol="sampled")
    data = json.loads(sampled.to_json())
    assert data["protocol"] == "sampled" and data["overall"]["filtered"] is None
    assert "sampled" in sampled.table().splitlines()[0]
    assert 0 < data["overall"]["raw"]["mrr"] <= 1 and data["loss"] > 0


def test_missing_default_filter_set_is_a_clear_error(model, tmp_path: Path) -> None:
    root, cfg, _, _ = model
    moved = cfg.model_copy(update={"edge_paths": [str(tmp_path / "gone")]})
    with pytest.raises(Exception, match="--filter-edges"):
        evaluate_checkpoint(moved, [root / "test"])


@pytest.mark.parametrize("breakage", ["no_dir", "no_version", "no_embeddings", "bad_metadata"])
def test_broken_checkpoint_is_one_line_naming_the_path(model, tmp_path: Path, capsys,
                                                       breakage: str) -> None:
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
    for argv in (["eval", str(config), "--edges", str(root / "test"), "--no-progress"],
                 ["export", str(ck), "--format", "npy", "--output", str(tmp_path / "x")],
                 ["similar", str(ck), "n1"]):
        assert cli_main(argv) == 2
        line = _err_line(capsys)
        assert str(ck) in line, line
        if breakage == "no_version":
            assert VERSION_FILE in line
        if breakage == "no_embeddings":
            assert "embeddings_node_0" in line
