"""User errors that say what would work: the known relations and ``dynamic_relations``,
``--delimiter`` for a file split at another character, the closest column name, a key's full
help from ``bigembed config keys KEY``; and the held-out mistakes (a multi-character delimiter,
Parquet list/struct columns, a Python config that exits or raises, a config for other entity
types), each refused in one line naming the file or key, with nothing written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bigembed.cli import main
from support.imports import leftovers, write_config

GOOD = "a\tr\tb\nb\tr\tc\n"


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that must fail: the one line it prints (stdout stays empty)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == "", out
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _import_fails(capsys: pytest.CaptureFixture[str], tmp: Path, *argv: str) -> str:
    line = _fails(capsys, "import", "--no-progress", *argv)
    assert not (tmp / "out").exists() and leftovers(tmp) == []
    return line


# --------------------------------------------------------------------------- relations


def test_unknown_relation_lists_the_known_ones_and_dynamic_relations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["follows", "likes", "knows", "blocks", "mentions", "quotes", "replies", "tags"]
    config = write_config(tmp_path, relations=[(n, "node", "node") for n in names])
    data = tmp_path / "e.tsv"
    data.write_text("a\tfollows\tb\nb\tknowz\tc\n")
    line = _import_fails(capsys, tmp_path, str(config), str(data))
    assert line.startswith(f"bigembed import: error: {data}:2: unknown relation ('knowz'")
    assert "[follows, likes, knows, blocks, mentions and 3 more]" in line
    assert "did you mean 'knows'?" in line and "dynamic_relations: true" in line
    data.write_text("a\tfollows\tb\nb\tzzz\tc\n")
    line = _import_fails(capsys, tmp_path, str(config), str(data))
    assert "'zzz' is not in the config's relations [follows," in line
    assert "did you mean" not in line and "dynamic_relations: true" in line


# --------------------------------------------------------------------------- delimiters, columns


@pytest.mark.parametrize(
    ("text", "name", "flag"),
    [
        ("src;rel;dst\na;r;b\n", "in.csv", "';'"),
        ("src|rel|dst\na|r|b\n", "in.csv", "'|'"),
        ("src\trel\tdst\na\tr\tb\n", "in.csv", "'\\t'"),
        ("src,rel,dst\na,r,b\n", "in.tsv", "','"),
        ("src rel dst\na r b\n", "in.tsv", "' '"),
    ],
)
def test_a_header_split_at_another_character_suggests_delimiter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, name: str, flag: str
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / name
    data.write_text(text)
    named = ["--header", "--lhs-col", "src", "--rel-col", "rel", "--rhs-col", "dst"]
    line = _import_fails(capsys, tmp_path, str(config), str(data), *named)
    assert f"{data}: no column 'src' for --lhs-col" in line
    assert line.endswith(f"into 3 columns (src, rel, dst): pass --delimiter {flag}"), line
    split = ["split", str(data), "--output", str(tmp_path / "s"), "--by-relation"]
    line = _fails(capsys, *split, "--header", "--rel-col", "rel")
    assert f"{data}:1: no column 'rel' in the header" in line
    assert line.endswith(f"pass --delimiter {flag}") and not (tmp_path / "s").exists(), line
    # by index, without a header: the same suggestion
    data.write_text(text.split("\n", 1)[1])
    line = _import_fails(capsys, tmp_path, str(config), str(data))
    assert f"{data}:1: has 1 column(s) but --rel-col is 1" in line
    assert line.endswith(f"pass --delimiter {flag}"), line
    line = _fails(capsys, *split)
    assert f"{data}:1: 1 field(s), need at least 3" in line
    assert line.endswith(f"pass --delimiter {flag}") and not (tmp_path / "s").exists(), line


def test_the_suggested_tab_delimiter_works_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.csv"
    data.write_text(GOOD)
    assert main(["import", "--no-progress", str(config), str(data), "--delimiter", "\\t"]) == 0
    assert f": 2 (from {data})" in capsys.readouterr().out


def test_a_column_typo_suggests_the_closest_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.csv"
    data.write_text("source,relation,target\na,r,b\n")
    cols = ["--rel-col", "relation", "--rhs-col", "target"]
    line = _import_fails(
        capsys, tmp_path, str(config), str(data), "--header", "--lhs-col", "src", *cols
    )
    assert line == (
        f"bigembed import: error: {data}: no column 'src' for --lhs-col (columns: source, "
        "relation, target); did you mean --lhs-col 'source'?"
    )
    line = _import_fails(
        capsys, tmp_path, str(config), str(data), "--header", "--lhs-col", "Source", *cols
    )
    assert line.endswith("did you mean --lhs-col 'source'?")
    line = _import_fails(
        capsys, tmp_path, str(config), str(data), "--header", "--lhs-col", "zzz", *cols
    )
    assert "did you mean" not in line and "--delimiter" not in line
    split = ["split", str(data), "--output", str(tmp_path / "s"), "--header", "--by-relation"]
    line = _fails(capsys, *split, "--rel-col", "rel")
    assert line.endswith("(columns: source, relation, target); did you mean --rel-col 'relation'?")


def test_a_wide_header_is_shown_in_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.csv"
    data.write_text(",".join(f"c{i}" for i in range(50)) + "\n" + ",".join("x" * 50) + "\n")
    line = _import_fails(capsys, tmp_path, str(config), str(data), "--header", "--lhs-col", "src")
    assert "(columns: c0, c1, c2, c3, c4, c5, c6, c7 and 42 more)" in line


@pytest.mark.parametrize("delimiter", ["::", "||", "", "é", '"'])
def test_a_delimiter_that_is_not_one_character_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], delimiter: str
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.tsv"
    data.write_text(GOOD)
    line = _import_fails(capsys, tmp_path, str(config), str(data), "--delimiter", delimiter)
    assert line.startswith(f"bigembed import: error: --delimiter {delimiter!r}: ")
    if len(delimiter) > 1:
        assert "must be one character" in line and "sed" in line
    line = _fails(
        capsys, "split", str(data), "--output", str(tmp_path / "s"), "--delimiter", delimiter
    )
    assert f"--delimiter {delimiter!r}: " in line and not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- Parquet


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ([["a"], ["b", "c"]], "list<element: string>"),
        ([{"x": "a"}, {"x": "b"}], "struct<x: string>"),
        ([[("k", "a")], [("k", "b")]], "map<string, string"),
    ],
)
def test_parquet_nested_columns_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], values: list, shown: str
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.parquet"
    src = pa.array(values, pa.map_(pa.string(), pa.string())) if "map" in shown else values
    pq.write_table(pa.table({"src": src, "rel": ["r", "r"], "dst": ["b", "c"]}), data)
    cols = ["--lhs-col", "src", "--rel-col", "rel", "--rhs-col", "dst"]
    line = _import_fails(capsys, tmp_path, str(config), str(data), *cols)
    assert line.startswith(
        f"bigembed import: error: {data}: column 'src' (--lhs-col) holds {shown}"
    ), line
    assert "values, not one name per row; " in line


# --------------------------------------------------------------------------- Python configs


@pytest.mark.parametrize(
    ("body", "where", "what"),
    [
        ("import sys\nsys.exit(3)\n", ":2: error while running the config", "sys.exit(3)"),
        (
            "import sys\ndef get_torchbiggraph_config():\n    sys.exit(3)\n",
            ":3: get_torchbiggraph_config() failed",
            "sys.exit(3)",
        ),
        ("raise SystemExit('stop')\n", ":1: error while running the config", "sys.exit('stop')"),
        (
            "def get_torchbiggraph_config():\n    raise KeyError('a\\nb')\n",
            ":2: get_torchbiggraph_config() failed",
            "KeyError: 'a",
        ),
    ],
)
def test_a_python_config_that_exits_or_raises_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, where: str, what: str
) -> None:
    config = tmp_path / "pbg_config.py"
    config.write_text(body)
    for command in (["config", "show"], ["train", "--no-progress"]):
        line = _fails(capsys, *command, str(config))
        assert f"error: {config}{where}: " in line and what in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pbg_config.py"]


# --------------------------------------------------------------------------- entity types


def test_a_config_for_other_entity_types_names_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "in.tsv"
    data.write_text(GOOD)
    assert main(["import", "--no-progress", str(config), str(data)]) == 0
    capsys.readouterr()
    entities = tmp_path / "out" / "entities"
    other = write_config(
        tmp_path, entities={"person": 1}, relations=[("knows", "person", "person")], name="o.yaml"
    )
    line = _fails(capsys, "train", "--no-progress", str(other))
    assert line == (
        "bigembed train: error: entities: the config's relations use entity types [person] but "
        f"the graph at {entities} was imported with [node] (missing: person); its relations "
        "differ too (config [knows], import [r]); re-run bigembed import with this config (or "
        "restore the config's entities)"
    )
    same = write_config(tmp_path, entities={"person": 1}, relations=[("r", "person", "person")])
    line = _fails(capsys, "train", "--no-progress", str(same))
    assert "types [person] but" in line and "imported with [node]" in line
    assert "relations differ" not in line
    assert not (tmp_path / "out" / "model").exists()


# --------------------------------------------------------------------------- config keys


def test_config_keys_listing_fits_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bigembed.config import config_keys

    for columns in (80, 132):
        monkeypatch.setenv("COLUMNS", str(columns))
        assert main(["config", "keys"]) == 0
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) <= columns
        listed = {line.split()[0] for line in out.splitlines() if line.strip()}
        assert {key for key, _, _, _ in config_keys()} <= listed
        assert "bigembed config keys KEY" in out.replace("\n", " ")


def test_config_keys_key_shows_it_in_full(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bigembed.config import config_keys

    monkeypatch.setenv("COLUMNS", "80")
    described = {key: text for key, _, _, text in config_keys()}
    assert main(["config", "keys", "relations[0].operator", "numEpochs", "half_precision"]) == 0
    out = capsys.readouterr().out
    blocks = out.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [
        "relations[i].operator",
        "num_epochs",
        "half_precision",
    ]
    assert "  allowed: none, translation, diagonal, linear, affine, complex_diagonal" in blocks[0]
    assert "  default: none" in blocks[0] and "  type:    str" in blocks[0]
    assert "  type:    int (>= 0)" in blocks[1] and "  default: 1" in blocks[1]
    assert "differs: true is refused (use compute_dtype: bfloat16)" in blocks[2]
    for block, key in zip(
        blocks, ("relations[i].operator", "num_epochs", "half_precision"), strict=True
    ):
        assert " ".join(block.split()).endswith(" ".join(described[key].split()))
    assert max(len(line) for line in out.splitlines()) <= 80
    # by the last part alone, or a type/param name in place of the placeholder
    assert main(["config", "keys", "entities.user.num_partitions", "tune.params.lr.low"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("entities.TYPE.num_partitions\n") and "\ntune.params.KEY.low\n" in out
    assert main(["config", "keys", "operator"]) == 0
    assert capsys.readouterr().out.startswith("relations[i].operator\n  type:    str\n")


def test_config_keys_unknown_key_is_one_line_with_close_matches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _fails(capsys, "config", "keys", "num_epochs", "dimensoin")
    assert line == (
        "bigembed config: error: unknown config key 'dimensoin'; did you mean dimension? "
        "(bigembed config keys lists every key)"
    )
    line = _fails(capsys, "config", "keys", "zzzz")
    assert "'zzzz'" in line and "did you mean" not in line
