"""`bigembed init EDGES` (a config from the file itself) and `bigembed datasets`, in-process.

Each init case writes a config from a file as a user has it (CSV/TSV/Parquet, with and
without a header, another separator, no relation column) and then runs `bigembed import
CONFIG EDGES` on it unchanged: what init wrote must be what import needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from bigembed.cli import main as cli_main
from bigembed.config import load_config

RELS = ("follows", "likes", "blocks")


def _rows(n: int = 60, rels: tuple[str, ...] = RELS) -> list[tuple[str, str, str]]:
    return [(f"p{i % 17}", rels[i % len(rels)], f"p{(i * 7 + 3) % 19}") for i in range(n)]


def _write_text(path: Path, rows: list[tuple[str, ...]], sep: str, header: list[str] | None):
    lines = [sep.join(header)] if header else []
    lines += [sep.join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _init(tmp_path: Path, capsys, *args: str) -> tuple[dict, str]:
    code = cli_main(["init", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    config = next(Path(a) for a in args if a.endswith(".yaml"))
    return yaml.safe_load(config.read_text(encoding="utf-8")), out.out


def _import(config: str, edges: str, capsys) -> str:
    code = cli_main(["import", config, edges, "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_csv_with_header_to_a_trained_model(tmp_path: Path, capsys) -> None:
    _write_text(tmp_path / "edges.csv", _rows(), ",", ["person", "relation", "other"])
    cfg, out = _init(tmp_path, capsys, "edges.csv", "--output", "edges.yaml")
    assert "(60 edges, csv)" in out and "comma-separated" in out
    assert "header: the first line names the columns: 'relation' is a column name" in out
    assert cfg["edge_files"] == {
        "header": True,
        "delimiter": ",",
        "lhs_col": "person",
        "rel_col": "relation",
        "rhs_col": "other",
    }
    assert [r["name"] for r in cfg["relations"]] == list(RELS)
    assert "dynamic_relations" not in cfg
    assert cfg["entity_path"] == "edges/entities" and cfg["checkpoint_path"] == "edges/model"
    text = (tmp_path / "edges.yaml").read_text()
    keys = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(" # " in line for line in keys), "every written key has a comment"
    summary = _import("edges.yaml", "edges.csv", capsys)
    assert "entities entity: 19" in summary or "entities entity: " in summary
    assert "relation types: 3" in summary and "60 (from edges.csv)" in summary
    argv = ["train", "edges.yaml", "-p", "num_epochs=1", "-p", "dimension=8", "-p", "workers=1"]
    code = cli_main(argv)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "edges/model").is_dir()


def test_tsv_without_header_many_relations_is_dynamic(tmp_path: Path, capsys) -> None:
    rels = tuple(f"r{i}" for i in range(8))
    _write_text(tmp_path / "kg.tsv", _rows(80, rels), "\t", None)
    cfg, out = _init(tmp_path, capsys, "kg.tsv", "-o", "kg.yaml", "--max-relations", "5")
    assert "no header line" in out and "dynamic_relations" in out
    assert cfg["edge_files"] == {
        "header": False,
        "delimiter": "\t",
        "lhs_col": 0,
        "rel_col": 1,
        "rhs_col": 2,
    }
    assert cfg["dynamic_relations"] is True and len(cfg["relations"]) == 1
    assert "relation types: 8" in _import("kg.yaml", "kg.tsv", capsys)


def test_semicolon_csv_and_two_column_tsv(tmp_path: Path, capsys) -> None:
    _write_text(tmp_path / "semi.csv", _rows(), ";", None)
    cfg, out = _init(tmp_path, capsys, "semi.csv", "-o", "semi.yaml")
    assert cfg["edge_files"]["delimiter"] == ";" and "semicolon-separated" in out
    assert "relation types: 3" in _import("semi.yaml", "semi.csv", capsys)

    pairs = [(a, c) for a, _, c in _rows()]
    _write_text(tmp_path / "pairs.tsv", pairs, "\t", None)
    cfg, out = _init(tmp_path, capsys, "pairs.tsv", "-o", "pairs.yaml")
    assert cfg["edge_files"]["rel_col"] is None and len(cfg["relations"]) == 1
    assert "one relation (no relation column)" in out
    assert "60 (from pairs.tsv)" in _import("pairs.yaml", "pairs.tsv", capsys)


def test_parquet_columns_by_name(tmp_path: Path, capsys) -> None:
    rows = _rows()
    table = pa.table(
        {
            "weight": [1.0] * len(rows),
            "dst": [r[2] for r in rows],
            "src": [r[0] for r in rows],
            "predicate": [r[1] for r in rows],
        }
    )
    pq.write_table(table, tmp_path / "g.parquet")
    cfg, _ = _init(tmp_path, capsys, "g.parquet", "-o", "g.yaml")
    assert cfg["edge_files"] == {"lhs_col": "src", "rel_col": "predicate", "rhs_col": "dst"}
    assert "relation types: 3" in _import("g.yaml", "g.parquet", capsys)
    # the flags win over the guesses: no relation column
    cfg, out = _init(tmp_path, capsys, "g.parquet", "-o", "g1.yaml", "--rel-col", "none")
    assert cfg["edge_files"]["rel_col"] is None and "--rel-col as given" in out


def test_tsv_with_header_and_numeric_ids(tmp_path: Path, capsys) -> None:
    rows = [(str(i % 13), str(i % 2), str((i * 5) % 11)) for i in range(40)]
    _write_text(tmp_path / "ids.tsv", rows, "\t", ["from_id", "kind", "to_id"])
    cfg, out = _init(tmp_path, capsys, "ids.tsv", "-o", "ids.yaml")
    assert "'from_id' is not a number but the rest of column 0 is" in out
    assert cfg["edge_files"]["header"] is True
    assert cfg["edge_files"]["lhs_col"] == "from_id" and cfg["edge_files"]["rhs_col"] == "to_id"
    assert [r["name"] for r in cfg["relations"]] == ["0", "1"]  # names, written as strings
    assert "relation types: 2" in _import("ids.yaml", "ids.tsv", capsys)


def test_excel_csv_and_unnamed_parquet_columns(tmp_path: Path, capsys) -> None:
    # a byte-order mark and spaces after the commas, as spreadsheets write them
    text = "\ufeffsource, relation, target\n" + "".join(f"{a}, {r}, {b}\n" for a, r, b in _rows())
    (tmp_path / "x.csv").write_text(text, encoding="utf-8")
    cfg, _ = _init(tmp_path, capsys, "x.csv", "-o", "x.yaml")
    assert cfg["edge_files"]["lhs_col"] == "source" and cfg["edge_files"]["rel_col"] == " relation"
    assert "relation types: 3" in _import("x.yaml", "x.csv", capsys)

    rows = _rows()
    columns = {f"c{i}": [r[i] for r in rows] for i in range(3)}
    pq.write_table(pa.table(columns), tmp_path / "c.parquet")
    cfg, out = _init(tmp_path, capsys, "c.parquet", "-o", "c.yaml")
    assert cfg["edge_files"] == {"lhs_col": "c0", "rel_col": "c1", "rhs_col": "c2"}
    assert "by position" in out
    assert "relation types: 3" in _import("c.yaml", "c.parquet", capsys)


def test_a_one_letter_entity_is_not_a_header(tmp_path: Path, capsys) -> None:
    rows = [("s", "follows", "t"), *_rows()]  # 's' and 't' are also header words of some
    _write_text(tmp_path / "s.csv", rows, ",", None)
    cfg, _ = _init(tmp_path, capsys, "s.csv", "-o", "s.yaml")
    assert cfg["edge_files"]["header"] is False
    assert "61 (from s.csv)" in _import("s.yaml", "s.csv", capsys)


def test_header_flags_override_the_guess(tmp_path: Path, capsys) -> None:
    # a first line of ordinary names: no header is seen, --header says there is one
    _write_text(tmp_path / "h.csv", _rows(), ",", ["who", "how", "whom"])
    cfg, _ = _init(tmp_path, capsys, "h.csv", "-o", "guess.yaml")
    assert cfg["edge_files"]["header"] is False
    cfg, _ = _init(tmp_path, capsys, "h.csv", "-o", "told.yaml", "--header", "--rhs-col", "whom")
    assert cfg["edge_files"]["header"] is True and cfg["edge_files"]["rhs_col"] == "whom"
    assert "60 (from h.csv)" in _import("told.yaml", "h.csv", capsys)
    # import's own flags still win over the config's edge_files
    code = cli_main(["import", "told.yaml", "h.csv", "--no-header", "--force", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "names a column, which needs --header" in err


def test_existing_config_is_replaced_only_when_ours_and_unedited(tmp_path: Path, capsys) -> None:
    _write_text(tmp_path / "e.csv", _rows(), ",", None)
    mine = tmp_path / "mine.yaml"
    mine.write_text("dimension: 3\n")
    assert cli_main(["init", "e.csv", "-o", "mine.yaml", "--force"]) == 2
    assert "bigembed init did not write it" in capsys.readouterr().err
    assert mine.read_text() == "dimension: 3\n"

    _init(tmp_path, capsys, "e.csv", "-o", "ours.yaml")
    assert cli_main(["init", "e.csv", "-o", "ours.yaml"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    _init(tmp_path, capsys, "e.csv", "-o", "ours.yaml", "--force")

    ours = tmp_path / "ours.yaml"
    ours.write_text(ours.read_text().replace("num_epochs: 10", "num_epochs: 50"))
    assert cli_main(["init", "e.csv", "-o", "ours.yaml", "--force"]) == 2
    assert "edited since" in capsys.readouterr().err
    assert "num_epochs: 50" in ours.read_text()
    assert load_config(ours).num_epochs == 50  # the edited config still loads


def test_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    path = _write_text(tmp_path / "bad.tsv", _rows(), "\t", None)
    path.write_text(path.read_text() + "a\tb\tc\td\n")
    assert cli_main(["init", "bad.tsv", "-o", "bad.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bigembed init: error: bad.tsv:61: 4 field(s)") and "\n" not in err
    assert not (tmp_path / "bad.yaml").exists()
    assert cli_main(["init", "bad.tsv", "-o", "x.txt"]) == 2
    assert "name the config .yaml" in capsys.readouterr().err


# ---------------------------------------------------------------------- datasets


def test_datasets_list_and_write(tmp_path: Path, capsys) -> None:
    assert cli_main(["datasets", "list"]) == 0
    assert capsys.readouterr().out.startswith("fb15k237  FB15k-237")
    assert cli_main(["datasets", "fb15k237", "--output", "data"]) == 0
    assert "test  data/test.txt" in capsys.readouterr().out
    lines = (tmp_path / "data/valid.txt").read_text().splitlines()
    assert len(lines) == 17_535 and len(lines[0].split("\t")) == 3
    marker = json.loads((tmp_path / "data/.bigembed-output.json").read_text())
    assert marker["kind"] == "dataset"

    assert cli_main(["datasets", "fb15k237", "--output", "data"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert cli_main(["datasets", "fb15k237", "--output", "data", "--force"]) == 0
    capsys.readouterr()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("keep me")
    assert cli_main(["datasets", "fb15k237", "--output", "mine", "--force"]) == 2
    assert "not replaced" in capsys.readouterr().err
    assert (tmp_path / "mine/notes.txt").read_text() == "keep me"
    assert cli_main(["datasets", "fb15k999", "--output", "x"]) == 2
    assert "no bundled dataset 'fb15k999' (bundled: fb15k237" in capsys.readouterr().err
