"""Writers of the export formats; each streams entity blocks (one partition at a time).

=============  ===========================================================================
format         files
=============  ===========================================================================
``tsv``        ``entities.tsv`` (PBG's layout: name, then the values, tab-separated, every
               type in one file) and ``relation_types.tsv`` (relation, side, operator,
               parameter, shape ``AxB``, values)
``npy``        ``embeddings_{type}.npy`` ``(count, dim)`` float32 and ``names_{type}.json``
               (a JSON list, row ``i`` = name ``i``); ``relation_params.npz`` (arrays ``"0"``,
               ``"1"``, ...) described by ``relation_params.json``
``parquet``    ``embeddings_{type}.parquet`` (``name`` string, ``embedding``
               fixed-size list of float32); ``relation_params.parquet``
``projector``  TensorBoard Embedding Projector: ``vectors.tsv``, ``metadata.tsv`` (header
               ``name<TAB>type``), ``projector_config.pbtxt``; plus ``relation_types.tsv``
=============  ===========================================================================

Numbers in text files are the shortest decimal that reads back as the same float32 (PBG
printed 9 decimals, which rounds small values to zero).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bigembed.errors import InputError
from bigembed.export.relations import RelationParam


@dataclass
class EntityBlock:
    """One partition's exported rows: names and vectors (global embedding added)."""

    etype: str
    part: int
    names: pa.Array
    vectors: np.ndarray  # (n, dim) float32


def _value_strings(vectors: np.ndarray) -> pa.Array:
    """Each row of ``vectors`` as one tab-separated string (one cast, one join, in C++)."""
    n, dim = vectors.shape
    flat = pc.cast(
        pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1)), pa.string()
    )
    offsets = pa.array(np.arange(0, n * dim + 1, dim, dtype=np.int32) if n else [0], pa.int32())
    return pc.binary_join(pa.ListArray.from_arrays(offsets, flat), "\t")


def _tsv_bytes(first: list[pa.Array], vectors: np.ndarray) -> bytes:
    """Tab-separated lines (each ending in a newline) of ``first`` columns then the values."""
    columns = list(first)
    if vectors.shape[1]:
        columns.append(_value_strings(vectors))
    if not columns or len(columns[0]) == 0:
        return b""
    lines = columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, "\t")
    lines = pc.binary_join_element_wise(lines, pa.scalar(""), "\n")  # append "\n"
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    offsets = offsets[lines.offset : lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(offsets[0]) : int(offsets[-1])].tobytes()


def _check_tsv_names(block: EntityBlock, where: str) -> None:
    bad = pc.match_substring_regex(block.names, r"[\t\n\r]")
    if pc.any(bad).as_py():
        name = block.names.filter(bad)[0].as_py()
        raise InputError(
            f"{where}: entity name {name!r} ({block.etype!r}) contains a tab or line break, "
            f"which a TSV file cannot hold; export with --format parquet or npy"
        )


def _relation_tsv(path: Path, params: list[RelationParam]) -> None:
    with open(path, "wb") as f:
        for p in params:
            first = [pa.array([x]) for x in (p.relation, p.side, p.operator, p.param, p.shape_text)]
            f.write(_tsv_bytes(first, p.values.reshape(1, -1)))


def write_tsv(
    out: Path, blocks: Iterable[EntityBlock], params: list[RelationParam], where: str
) -> list[str]:
    with open(out / "entities.tsv", "wb") as f:
        for block in blocks:
            _check_tsv_names(block, where)
            f.write(_tsv_bytes([block.names], block.vectors))
    _relation_tsv(out / "relation_types.tsv", params)
    return ["entities.tsv", "relation_types.tsv"]


def write_projector(
    out: Path, blocks: Iterable[EntityBlock], params: list[RelationParam], where: str
) -> list[str]:
    with open(out / "vectors.tsv", "wb") as vf, open(out / "metadata.tsv", "wb") as mf:
        mf.write(b"name\ttype\n")
        for block in blocks:
            vf.write(_tsv_bytes([], block.vectors))
            # the projector shows names only: tabs and line breaks become spaces
            names = pc.replace_substring_regex(block.names, r"[\t\n\r]", " ")
            types = pa.array([block.etype] * len(names), pa.string())
            mf.write(_tsv_bytes([names, types], np.empty((len(names), 0), np.float32)))
    (out / "projector_config.pbtxt").write_text(
        'embeddings {\n  tensor_path: "vectors.tsv"\n  metadata_path: "metadata.tsv"\n}\n'
    )
    _relation_tsv(out / "relation_types.tsv", params)
    return ["vectors.tsv", "metadata.tsv", "projector_config.pbtxt", "relation_types.tsv"]


def write_npy(
    out: Path,
    blocks: Iterable[EntityBlock],
    params: list[RelationParam],
    where: str,
    shapes: dict[str, tuple[int, int]],
) -> list[str]:
    files: list[str] = []
    arrays: dict[str, np.memmap] = {}
    name_files: dict[str, TextIO] = {}
    filled: dict[str, int] = {}
    try:
        for block in blocks:
            t = block.etype
            if t not in arrays:
                arrays[t] = np.lib.format.open_memmap(
                    out / f"embeddings_{t}.npy", mode="w+", dtype=np.float32, shape=shapes[t]
                )
                f = open(out / f"names_{t}.json", "w", encoding="utf-8")  # noqa: SIM115
                f.write("[")
                name_files[t] = f
                filled[t] = 0
                files += [f"embeddings_{t}.npy", f"names_{t}.json"]
            n = len(block.names)
            arrays[t][filled[t] : filled[t] + n] = block.vectors
            text = ",".join(json.dumps(x, ensure_ascii=False) for x in block.names.to_pylist())
            name_files[t].write(("," if filled[t] and text else "") + text)
            filled[t] += n
        for t, shape in shapes.items():  # types without rows still get (empty) files
            if t not in arrays:
                np.save(out / f"embeddings_{t}.npy", np.zeros(shape, np.float32))
                (out / f"names_{t}.json").write_text("[]\n")
                files += [f"embeddings_{t}.npy", f"names_{t}.json"]
    finally:
        for names_file in name_files.values():
            names_file.write("]\n")
            names_file.close()
        for a in arrays.values():
            a.flush()
    # Any: mypy matches **kwargs against savez's ``allow_pickle: bool`` too (keys are digits)
    relation_arrays: dict[str, Any] = {str(i): p.values for i, p in enumerate(params)}
    np.savez(out / "relation_params.npz", **relation_arrays)
    index = [
        {
            "key": str(i),
            "relation": p.relation,
            "side": p.side,
            "operator": p.operator,
            "param": p.param,
            "shape": list(p.values.shape),
        }
        for i, p in enumerate(params)
    ]
    (out / "relation_params.json").write_text(json.dumps(index, indent=1) + "\n")
    return [*files, "relation_params.npz", "relation_params.json"]


def write_parquet(
    out: Path,
    blocks: Iterable[EntityBlock],
    params: list[RelationParam],
    where: str,
    shapes: dict[str, tuple[int, int]],
) -> list[str]:
    writers: dict[str, pq.ParquetWriter] = {}
    files: list[str] = []

    def schema(dim: int) -> pa.Schema:
        return pa.schema([("name", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])

    try:
        for block in blocks:
            t = block.etype
            dim = shapes[t][1]
            if t not in writers:
                writers[t] = pq.ParquetWriter(out / f"embeddings_{t}.parquet", schema(dim))
                files.append(f"embeddings_{t}.parquet")
            flat = pa.array(np.ascontiguousarray(block.vectors, np.float32).reshape(-1))
            emb = pa.FixedSizeListArray.from_arrays(flat, dim)
            writers[t].write_table(pa.table([block.names, emb], schema=schema(dim)))
        for t, (_, dim) in shapes.items():
            if t not in writers:
                pq.write_table(schema(dim).empty_table(), out / f"embeddings_{t}.parquet")
                files.append(f"embeddings_{t}.parquet")
    finally:
        for w in writers.values():
            w.close()
    table = pa.table(
        {
            "relation": pa.array([p.relation for p in params], pa.string()),
            "side": pa.array([p.side for p in params], pa.string()),
            "operator": pa.array([p.operator for p in params], pa.string()),
            "param": pa.array([p.param for p in params], pa.string()),
            "shape": pa.array([list(p.values.shape) for p in params], pa.list_(pa.int64())),
            "values": pa.array([p.values.reshape(-1) for p in params], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, out / "relation_params.parquet")
    return [*files, "relation_params.parquet"]
