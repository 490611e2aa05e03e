"""Bad input: one clear message naming file and line, non-zero exit, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigembed.cli import main
from support.imports import leftovers, write_config


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["import", "--no-progress", *argv])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def _assert_clean(tmp: Path) -> None:
    assert not (tmp / "out").exists(), sorted(str(p) for p in (tmp / "out").rglob("*"))
    assert leftovers(tmp) == []


GOOD = "a\tr\tb\nb\tr\tc\n"


@pytest.mark.parametrize(
    ("content", "line", "why"),
    [
        (GOOD + "c\tr\n", 3, "wrong number of columns: expected 3, got 2"),
        (GOOD + "\nc\tr\td\textra\n", 4, "wrong number of columns: expected 3, got 4"),
        (GOOD + "\n\nc\tr\t\n", 5, "empty entity name"),
        (GOOD + "c\t\td\n", 3, "empty relation name"),
        (
            GOOD * 3 + "c\tzz\td\n",
            7,
            "unknown relation ('zz' is not in the config's relations [r]; ",
        ),
        (GOOD + "c\tr\td\n\nx\tr\t\xff\n", None, None),  # replaced with bytes below
    ],
)
def test_bad_line_names_file_and_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    line: int | None,
    why: str | None,
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "bad.tsv"
    if line is None:
        data.write_bytes(GOOD.encode() + b"c\tr\td\n\nx\tr\t\xff\xfe\n")
        line, why = 5, "non-UTF-8 bytes"
    else:
        data.write_text(content)
    code, err = _run(capsys, str(config), str(data))
    assert code != 0
    assert f"{data}:{line}: {why}" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    _assert_clean(tmp_path)


def test_bad_weight_and_bad_lines_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "w.tsv"
    data.write_text("a\tr\tb\t0.5\nb\tr\tc\tabc\n")
    code, err = _run(capsys, str(config), str(data), "--weight-col", "3")
    assert code != 0 and f"{data}:2: bad weight ('abc'" in err
    _assert_clean(tmp_path)
    data.write_text("a\tr\tb\t0.5\nb\tr\tc\tabc\nb\tr\tc\n\nc\tzz\ta\t1\nc\tr\ta\t-1\nd\tr\te\t2\n")
    code, out = _run(capsys, str(config), str(data), "--weight-col", "3", "--skip-bad-lines")
    assert code == 0, out
    assert "edges" in out and ": 2 (from" in out
    assert "skipped 2 bad lines: bad weight" in out
    assert "skipped 1 bad lines: unknown relation" in out
    assert "skipped 1 bad lines: wrong number of columns" in out
    assert f"{data}:5: unknown relation" in out and f"{data}:3: wrong number of columns" in out


def test_empty_missing_and_wrong_count_of_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    code, err = _run(capsys, str(config), str(empty))
    assert code != 0 and f"{empty}: empty input file" in err
    blank = tmp_path / "blank.tsv"
    blank.write_text("\n\n")
    code, err = _run(capsys, str(config), str(blank))
    assert code != 0 and str(blank) in err and "no edges" in err
    missing = tmp_path / "missing.tsv"
    code, err = _run(capsys, str(config), str(missing))
    assert code != 0 and f"{missing}: input file not found" in err
    good = tmp_path / "good.tsv"
    good.write_text(GOOD)
    code, err = _run(capsys, str(config), str(good), str(good))
    assert code != 0 and "got 2 input file(s) but the config has 1 edge_paths" in err
    code, err = _run(capsys, str(config), str(good), "--rhs-col", "5")
    assert code != 0 and f"{good}:1: has 3 column(s) but --rhs-col is 5" in err
    code, err = _run(capsys, str(config), str(good), "--rhs-col", "tail")
    assert code != 0 and "needs --header" in err
    _assert_clean(tmp_path)


def test_existing_output_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    good = tmp_path / "good.tsv"
    good.write_text(GOOD)
    assert _run(capsys, str(config), str(good))[0] == 0
    manifest = tmp_path / "out" / "edges" / "manifest.json"
    before = manifest.read_text()
    code, err = _run(capsys, str(config), str(good))
    assert code != 0 and "entities: already holds an entity store" in err and "--force" in err
    good.write_text(GOOD + "c\tr\td\n")
    assert _run(capsys, str(config), str(good), "--force")[0] == 0
    assert manifest.read_text() != before
    # a failing forced import leaves the previous output untouched
    bad = tmp_path / "bad.tsv"
    bad.write_text(GOOD + "x\n")
    after = manifest.read_text()
    code, err = _run(capsys, str(config), str(bad), "--force")
    assert code != 0 and f"{bad}:3:" in err
    assert manifest.read_text() == after
    assert leftovers(tmp_path) == []


def test_edge_path_alone_exists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    (tmp_path / "out" / "edges").mkdir(parents=True)
    (tmp_path / "out" / "edges" / "x").write_text("old")
    good = tmp_path / "good.tsv"
    good.write_text(GOOD)
    code, err = _run(capsys, str(config), str(good))
    assert code != 0 and "edges: edge path already exists" in err
    assert not (tmp_path / "out" / "entities").exists()
    assert leftovers(tmp_path) == []


def test_parquet_bad_row_is_named_by_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = write_config(tmp_path)
    data = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"h": ["a", "b", None], "r": ["r", "r", "r"], "t": ["b", "c", "d"]}), data
    )
    code, err = _run(
        capsys, str(config), str(data), "--lhs-col", "h", "--rel-col", "r", "--rhs-col", "t"
    )
    assert code != 0 and f"{data}: row 3: empty entity name" in err
    _assert_clean(tmp_path)
    code, err = _run(capsys, str(config), str(data), "--rhs-col", "nope")
    assert code != 0 and "no column 'nope' for --rhs-col (columns: h, r, t)" in err
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("a\tr\tb\n")
    code, err = _run(capsys, str(config), str(not_parquet))
    assert code != 0 and f"{not_parquet}: cannot read this parquet file" in err
    _assert_clean(tmp_path)


def test_unknown_extension_and_forced_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path, entities={"node": 1, "unused": 2}, relations=[("r", "node", "node")]
    )
    data = tmp_path / "edges.dat"
    data.write_text(GOOD)
    code, err = _run(capsys, str(config), str(data))
    assert code != 0 and "cannot tell the format" in err and "--format" in err
    code, out = _run(capsys, str(config), str(data), "--format", "tsv")
    assert code == 0, out
    assert "entities unused: 0" in out
