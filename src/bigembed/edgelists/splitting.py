"""Split an edge-list file into train / valid / test files of the same format (``bigembed split``).

Two passes over the input, never holding its rows: the first reads the lhs/rel/rhs columns and
checks them (a bad line stops with ``FILE:LINE``), the second copies every line verbatim (text:
same delimiter, quoting, extra columns and header; Parquet: same schema) to the file of its
part. What is held in memory is one byte per edge for its part, plus, with ``by_relation`` or
``keep_entities_in_train``, one integer per edge and side and the names seen.

The assignment is a seeded permutation, so the same input, fractions and seed give the same
split. ``by_relation`` draws the fractions within each relation (every relation is represented
in every part in proportion). ``keep_entities_in_train`` moves back to train every held-out edge
with an entity that train lacks: an entity that is never trained has a random embedding, and
ranking against it measures nothing.
"""

from __future__ import annotations

import array
import csv
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bigembed.atomic import atomic_directory
from bigembed.edgelists.hints import column_hint, delimiter_hint, shown_delimiter, shown_names
from bigembed.edgelists.inputs import ColumnSpec, TextOptions, detect_format
from bigembed.errors import InputError

PARTS = ("train", "valid", "test")
_CODECS = {"gzip": "gzip", "bz2": "bz2", "zstd": "zstd"}


@dataclass(frozen=True)
class SplitOptions:
    """What ``bigembed split`` was asked for (fractions of the edges, per part)."""

    valid: float = 0.1
    test: float = 0.1
    by_relation: bool = False
    keep_entities_in_train: bool = False
    seed: int = 0
    columns: ColumnSpec = field(default_factory=ColumnSpec)
    text: TextOptions = field(default_factory=TextOptions)
    format: str | None = None
    force: bool = False

    def check(self) -> None:
        for name, value in (("--valid", self.valid), ("--test", self.test)):
            if not 0.0 <= value < 1.0:
                raise InputError(f"{name} {value}: a fraction of the edges must be in [0, 1)")
        if self.valid + self.test >= 1.0:
            raise InputError(
                f"--valid {self.valid} + --test {self.test} leaves no edges to train on"
            )


@dataclass
class SplitSummary:
    """Counts per part, and where they went."""

    input: Path
    output: Path
    files: dict[str, Path]
    counts: dict[str, int]
    moved_to_train: int
    seed: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def format(self) -> str:
        parts = ", ".join(
            f"{p} {self.counts[p]:,} ({100.0 * self.counts[p] / max(self.total, 1):.1f}%)"
            for p in PARTS
        )
        lines = [f"Split {self.total:,} edges of {self.input} (seed {self.seed}): {parts}"]
        if self.moved_to_train:
            lines.append(
                f"{self.moved_to_train:,} held-out edge(s) moved to train so that every entity "
                "of valid/test is in train"
            )
        lines += [f"  {p:<5} {self.files[p]}" for p in PARTS]
        return "\n".join(lines)


# ---------------------------------------------------------------------- reading
@dataclass
class _Rows:
    """What the first pass keeps per edge (ids only where the options need them)."""

    count: int = 0
    rel: array.array = field(default_factory=lambda: array.array("q"))  # 8 bytes per edge
    lhs: array.array = field(default_factory=lambda: array.array("q"))
    rhs: array.array = field(default_factory=lambda: array.array("q"))


class _Interner(dict[str, int]):
    def id(self, name: str) -> int:
        got = self.get(name)
        if got is None:
            got = self[name] = len(self)
        return got


def _split_line(line: str, delimiter: str, quoted: bool) -> list[str]:
    text = line.rstrip("\r\n")
    if quoted and '"' in text:
        return next(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    return text.split(delimiter)


def _column_index(
    spec: int | str, role: str, header: list[str] | None, path: Path, delimiter: str
) -> int:
    if isinstance(spec, int):
        return spec
    if header is None:
        raise InputError(
            f"{path}: --{role}-col {spec!r} is a column name; pass --header (the first line then "
            "names the columns) or give a 0-based index"
        )
    if spec not in header:
        line = delimiter.join(header)
        hint = delimiter_hint(line, delimiter, names=[spec]) or column_hint(
            spec, header, f"--{role}-col"
        )
        raise InputError(
            f"{path}:1: no column {spec!r} in the header (columns: {shown_names(header)}){hint}"
        )
    return header.index(spec)


class _TextSource:
    """A text edge list read line by line (plain or compressed as its name says)."""

    def __init__(self, path: Path, fmt: str, compression: str | None, opts: SplitOptions) -> None:
        self.path = path
        self.compression = compression
        self.quoted = fmt == "csv"
        self.delimiter = opts.text.delimiter or ("," if self.quoted else "\t")
        self.has_header = opts.text.header

    def open(self) -> io.TextIOWrapper:
        import pyarrow as pa

        raw = pa.input_stream(str(self.path), compression=self.compression)
        return io.TextIOWrapper(raw, encoding="utf-8", newline="")

    def lines(self) -> Iterator[tuple[int, str]]:
        """(first line number, text) of the data records (header and blank lines skipped).

        In CSV a quoted field may hold line breaks: a record then spans several lines and is
        yielded whole, so that it is copied verbatim to one part.
        """
        with self.open() as f:
            try:
                pending, start = "", 0
                for number, line in enumerate(f, start=1):
                    if number == 1 and self.has_header:
                        continue
                    if pending:
                        pending += line
                    elif line.strip():
                        pending, start = line, number
                    else:
                        continue
                    # RFC 4180: quotes open and close fields or come doubled inside them, so a
                    # record is complete when its quote count is even.
                    if not self.quoted or pending.count('"') % 2 == 0:
                        yield start, pending
                        pending = ""
                if pending:
                    raise InputError(f"{self.path}:{start}: a quoted field is never closed")
            except UnicodeDecodeError:
                raise InputError(f"{self.path}: not UTF-8 text") from None

    def header(self) -> tuple[str | None, list[str] | None]:
        if not self.has_header:
            return None, None
        with self.open() as f:
            try:
                first = f.readline()
            except UnicodeDecodeError:
                raise InputError(f"{self.path}:1: not UTF-8 text") from None
        return first, _split_line(first, self.delimiter, self.quoted)

    def read(self, opts: SplitOptions, need_rel: bool, need_ents: bool) -> _Rows:
        _, header = self.header()
        cols = opts.columns
        li = _column_index(cols.lhs, "lhs", header, self.path, self.delimiter)
        ri = _column_index(cols.rhs, "rhs", header, self.path, self.delimiter)
        reli = (
            None
            if cols.rel is None
            else _column_index(cols.rel, "rel", header, self.path, self.delimiter)
        )
        width = max(i for i in (li, ri, reli) if i is not None) + 1
        rows, rels, ents = _Rows(), _Interner(), _Interner()
        for number, line in self.lines():
            fields = _split_line(line, self.delimiter, self.quoted)
            if len(fields) < width:
                # on the first line only: a file whose later lines differ is not fixed by it
                hint = delimiter_hint(line, self.delimiter, width=width) if not rows.count else ""
                raise InputError(
                    f"{self.path}:{number}: {len(fields)} field(s), need at least {width} "
                    f"(separator {shown_delimiter(self.delimiter)}){hint}"
                )
            for role, i in (("lhs", li), ("rhs", ri), ("relation", reli)):
                if i is not None and not fields[i].strip():
                    raise InputError(f"{self.path}:{number}: empty {role} name")
            rows.count += 1
            if need_rel:
                rows.rel.append(0 if reli is None else rels.id(fields[reli]))
            if need_ents:
                rows.lhs.append(ents.id(fields[li]))
                rows.rhs.append(ents.id(fields[ri]))
        return rows

    def write(self, labels: np.ndarray, files: dict[str, Path]) -> None:
        import pyarrow as pa

        header, _ = self.header()
        outs = {
            p: io.TextIOWrapper(
                pa.output_stream(str(files[p]), compression=self.compression),
                encoding="utf-8",
                newline="",
            )
            for p in PARTS
        }
        try:
            if header is not None:
                for out in outs.values():
                    out.write(header if header.endswith("\n") else header + "\n")
            by_label = [outs[p] for p in PARTS]
            for index, (_, line) in enumerate(self.lines()):
                by_label[labels[index]].write(line if line.endswith("\n") else line + "\n")
        finally:
            for out in outs.values():
                out.close()


class _ParquetSource:
    """A Parquet edge list read in record batches."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _file(self):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(self.path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise InputError(f"{self.path}: not a readable Parquet file ({exc})") from None

    def read(self, opts: SplitOptions, need_rel: bool, need_ents: bool) -> _Rows:
        pf = self._file()
        names = pf.schema_arrow.names
        cols = opts.columns

        def name(spec: int | str | None, role: str) -> str | None:
            if spec is None:
                return None
            if isinstance(spec, int):
                if spec >= len(names):
                    raise InputError(f"{self.path}: no column {spec} ({len(names)} columns)")
                return names[spec]
            if spec not in names:
                raise InputError(f"{self.path}: no column {spec!r} (columns: {', '.join(names)})")
            return spec

        lhs, rhs = str(name(cols.lhs, "lhs")), str(name(cols.rhs, "rhs"))
        rel = name(cols.rel, "rel")
        wanted = [c for c in (lhs, rhs, rel) if c is not None]
        rows, rels, ents = _Rows(), _Interner(), _Interner()
        for batch in pf.iter_batches(columns=wanted):
            data = {c: batch.column(c).to_pylist() for c in wanted}
            for k in range(batch.num_rows):
                row_no = rows.count + 1
                for c in wanted:
                    if data[c][k] is None or not str(data[c][k]).strip():
                        raise InputError(f"{self.path}: row {row_no}: empty value in column {c!r}")
                rows.count += 1
                if need_rel:
                    rows.rel.append(0 if rel is None else rels.id(str(data[rel][k])))
                if need_ents:
                    rows.lhs.append(ents.id(str(data[lhs][k])))
                    rows.rhs.append(ents.id(str(data[rhs][k])))
        return rows

    def write(self, labels: np.ndarray, files: dict[str, Path]) -> None:
        import pyarrow.parquet as pq

        pf = self._file()
        writers = {p: pq.ParquetWriter(files[p], pf.schema_arrow) for p in PARTS}
        try:
            start = 0
            for batch in pf.iter_batches():
                mine = labels[start : start + batch.num_rows]
                start += batch.num_rows
                for label, p in enumerate(PARTS):
                    idx = np.flatnonzero(mine == label)
                    if idx.size:
                        writers[p].write_batch(batch.take(idx))
        finally:
            for w in writers.values():
                w.close()


# ---------------------------------------------------------------------- assignment
def _assign(rows: _Rows, opts: SplitOptions) -> tuple[np.ndarray, int]:
    """Part label per edge (0 train, 1 valid, 2 test) and how many were moved back to train."""
    rng = np.random.default_rng(opts.seed)
    labels = np.zeros(rows.count, dtype=np.int8)
    groups: list[np.ndarray | None]
    if opts.by_relation:
        rel = np.frombuffer(rows.rel, dtype=np.int64)
        order = np.argsort(rel, kind="stable")
        bounds = np.flatnonzero(np.diff(rel[order])) + 1
        groups = list(np.split(order, bounds)) if rows.count else []
    else:
        groups = [None]
    for members in groups:
        n = rows.count if members is None else len(members)
        perm = rng.permutation(n)
        if members is not None:
            perm = members[perm]
        n_valid, n_test = round(n * opts.valid), round(n * opts.test)
        labels[perm[:n_valid]] = 1
        labels[perm[n_valid : n_valid + n_test]] = 2
    moved = 0
    if opts.keep_entities_in_train and rows.count:
        lhs = np.frombuffer(rows.lhs, dtype=np.int64)
        rhs = np.frombuffer(rows.rhs, dtype=np.int64)
        size = int(max(lhs.max(), rhs.max())) + 1
        train = labels == 0
        seen = np.bincount(lhs[train], minlength=size) + np.bincount(rhs[train], minlength=size)
        held = np.flatnonzero(~train)
        missing = (seen[lhs[held]] == 0) | (seen[rhs[held]] == 0)
        labels[held[missing]] = 0
        moved = int(missing.sum())
    return labels, moved


# ---------------------------------------------------------------------- the command's call
def split_edges(path: str | os.PathLike[str], output: str | os.PathLike[str], opts: SplitOptions):
    """Split ``path`` into ``output/{train,valid,test}{suffixes}``; returns a SplitSummary.

    The output directory is built under a temporary name and published whole (with bigembed's
    output marker, so ``force`` replaces only an earlier split). Nothing is written when the
    input is bad.
    """
    from bigembed.output_paths import check_replaceable, refuse_overlap

    opts.check()
    src_path, out = Path(path), Path(output)
    if not src_path.is_file():
        raise InputError(f"{src_path}: no such file")
    refuse_overlap([out], [src_path])
    check_replaceable(out, "split", force=opts.force)
    fmt, compression = detect_format(src_path, opts.format)
    source: _TextSource | _ParquetSource = (
        _ParquetSource(src_path)
        if fmt == "parquet"
        else _TextSource(src_path, fmt, _CODECS.get(compression or ""), opts)
    )
    rows = source.read(opts, opts.by_relation, opts.keep_entities_in_train)
    if rows.count == 0:
        raise InputError(f"{src_path}: no edges")
    labels, moved = _assign(rows, opts)
    del rows
    kept = src_path.suffixes[-2:] if compression else src_path.suffixes[-1:]
    suffix = "".join(kept) if kept else f".{fmt}"
    names = {p: p + suffix for p in PARTS}
    with atomic_directory(out, force=opts.force, marker="split") as tmp:
        source.write(labels, {p: tmp / names[p] for p in PARTS})
    counts = {p: int((labels == i).sum()) for i, p in enumerate(PARTS)}
    return SplitSummary(src_path, out, {p: out / names[p] for p in PARTS}, counts, moved, opts.seed)
