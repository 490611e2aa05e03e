"""``bigembed split``: train/valid/test files, reproducible, by relation, entities kept in train."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bigembed.cli import main as cli_main
from support.imports import random_edges, write_tsv

PARTS = ("train", "valid", "test")


def _split(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(["split", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def edges_csv(tmp_path: Path) -> Path:
    rows = random_edges(2000, 300, ["a", "b", "rare"], seed=1)
    rows = [r for r in rows if r[1] != "rare"]
    rare = [(f"chain{i}", "rare", f"chain{i + 1}") for i in range(40)]
    rows = [(h, r, t, "extra") for h, r, t in rows + rare]
    return write_tsv(tmp_path / "edges.csv", rows, sep=",", header="head,rel,tail,note")


def test_split_is_a_partition_of_the_lines_and_reproducible(tmp_path, edges_csv, capsys) -> None:
    code, out, err = _split(
        capsys, str(edges_csv), "-o", str(tmp_path / "a"), "--header", "--seed", "3"
    )
    assert code == 0, err
    assert "train" in out and "(80.0%)" in out
    source = _lines(edges_csv)
    parts = {p: _lines(tmp_path / "a" / f"{p}.csv") for p in PARTS}
    assert all(lines[0] == "head,rel,tail,note" for lines in parts.values())  # header kept
    assert Counter(line for p in PARTS for line in parts[p][1:]) == Counter(source[1:])
    n = len(source) - 1
    assert len(parts["valid"]) - 1 == round(n * 0.1) == len(parts["test"]) - 1
    # same seed: same files; another seed: another split
    assert (
        _split(capsys, str(edges_csv), "-o", str(tmp_path / "b"), "--header", "--seed", "3")[0] == 0
    )
    assert (
        _split(capsys, str(edges_csv), "-o", str(tmp_path / "c"), "--header", "--seed", "4")[0] == 0
    )
    for p in PARTS:
        name = f"{p}.csv"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "test.csv").read_bytes() != (tmp_path / "c" / "test.csv").read_bytes()


def test_split_by_relation_and_keep_entities(tmp_path, edges_csv, capsys) -> None:
    out_dir = tmp_path / "s"
    code, _, err = _split(
        capsys,
        str(edges_csv),
        "-o",
        str(out_dir),
        "--header",
        "--by-relation",
        "--valid",
        "0.25",
        "--test",
        "0.25",
        "--rel-col",
        "rel",
    )
    assert code == 0, err
    rare = {p: sum(",rare," in line for line in _lines(out_dir / f"{p}.csv")) for p in PARTS}
    assert rare == {"train": 20, "valid": 10, "test": 10}  # 40 rare edges split 50/25/25
    # keep-entities: every head and tail of valid/test appears in train
    code, out, err = _split(
        capsys,
        str(edges_csv),
        "-o",
        str(tmp_path / "k"),
        "--header",
        "--valid",
        "0.25",
        "--test",
        "0.25",
        "--keep-entities-in-train",
    )
    assert code == 0, err
    assert "moved to train" in out  # the rare chain's entities occur once or twice
    split = {
        p: [line.split(",") for line in _lines(tmp_path / "k" / f"{p}.csv")[1:]] for p in PARTS
    }
    in_train = {x for f in split["train"] for x in (f[0], f[2])}
    held = [x for p in ("valid", "test") for f in split[p] for x in (f[0], f[2])]
    assert held and all(x in in_train for x in held)


def test_split_parquet_and_compressed(tmp_path, capsys) -> None:
    rows = random_edges(500, 50, ["r", "s"], seed=2)
    table = pa.table(
        {"h": [r[0] for r in rows], "r": [r[1] for r in rows], "t": [r[2] for r in rows]}
    )
    pq.write_table(table, tmp_path / "e.parquet")
    code, _, err = _split(capsys, str(tmp_path / "e.parquet"), "-o", str(tmp_path / "p"))
    assert code == 0, err
    back = [pq.read_table(tmp_path / "p" / f"{p}.parquet") for p in PARTS]
    assert [t.num_rows for t in back] == [400, 50, 50]
    assert all(t.schema == table.schema for t in back)
    got = Counter(tuple(x.values()) for t in back for x in t.to_pylist())
    assert got == Counter(rows)
    import gzip

    with gzip.open(tmp_path / "e.tsv.gz", "wt") as f:
        f.writelines("\t".join(r) + "\n" for r in rows)
    code, _, err = _split(capsys, str(tmp_path / "e.tsv.gz"), "-o", str(tmp_path / "g"))
    assert code == 0, err
    with gzip.open(tmp_path / "g" / "valid.tsv.gz", "rt") as f:
        assert len(f.read().splitlines()) == 50


def test_split_refuses_bad_input_and_unsafe_outputs(tmp_path, edges_csv, capsys) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tr\tb\nc\tr\n")
    code, _, err = _split(capsys, str(bad), "-o", str(tmp_path / "out"))
    assert code == 2 and err.strip().splitlines() == [
        f"bigembed split: error: {bad}:2: 2 field(s), need at least 3 (separator '\\t')"
    ]
    assert not (tmp_path / "out").exists()  # nothing written
    bad.write_text("a\tr\tb\n\tr\tc\n")
    code, _, err = _split(capsys, str(bad), "-o", str(tmp_path / "out"))
    assert code == 2 and f"{bad}:2: empty lhs name" in err
    code, _, err = _split(capsys, str(edges_csv), "-o", str(tmp_path), "--header")
    assert code == 2 and "holds the input" in err and len(err.strip().splitlines()) == 1
    code, _, err = _split(capsys, str(edges_csv), "-o", str(tmp_path / "x"), "--rel-col", "rel")
    assert code == 2 and "pass --header" in err
    code, _, err = _split(
        capsys, str(edges_csv), "-o", str(tmp_path / "x"), "--valid", "0.6", "--test", "0.5"
    )
    assert code == 2 and "leaves no edges" in err
    # an existing directory of the user's is never replaced; an earlier split is, with --force
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _, err = _split(capsys, str(edges_csv), "-o", str(mine), "--header", "--force")
    assert code == 2 and (mine / "notes.txt").read_text() == "keep me"
    assert _split(capsys, str(edges_csv), "-o", str(tmp_path / "s"), "--header")[0] == 0
    code, _, err = _split(capsys, str(edges_csv), "-o", str(tmp_path / "s"), "--header")
    assert code == 2 and "--force" in err
    assert _split(capsys, str(edges_csv), "-o", str(tmp_path / "s"), "--header", "--force")[0] == 0


def test_split_keeps_a_quoted_csv_field_with_line_breaks_in_one_record(tmp_path, capsys) -> None:
    """A CSV record whose quoted field spans lines goes whole to one part; an unclosed quote is
    named."""
    records = [f'e{i},r,e{i + 1},"note {i}\nsecond ""line"" {i}"\n' for i in range(60)]
    path = tmp_path / "notes.csv"
    path.write_text("head,rel,tail,note\n" + "".join(records), encoding="utf-8")
    code, _, err = _split(
        capsys,
        str(path),
        "-o",
        str(tmp_path / "q"),
        "--header",
        "--rel-col",
        "rel",
        "--by-relation",
        "--valid",
        "0.2",
        "--test",
        "0.2",
    )
    assert code == 0, err
    texts = {p: (tmp_path / "q" / f"{p}.csv").read_text(encoding="utf-8") for p in PARTS}
    got = Counter(r for p in PARTS for r in texts[p].split("\n", 1)[1].split("\n") if r)
    assert got == Counter(line for r in records for line in r.split("\n") if line)
    assert [texts[p].count("\nsecond") for p in PARTS] == [36, 12, 12]  # whole records
    path.write_text('head,rel,tail,note\na,r,b,"never closed\nc,r,d,x\n', encoding="utf-8")
    code, _, err = _split(capsys, str(path), "-o", str(tmp_path / "u"), "--header")
    assert code == 2 and f"{path}:2: a quoted field is never closed" in err
    assert not (tmp_path / "u").exists()
