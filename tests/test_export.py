"""``bigembed export``: every format round trips values and names; outputs are atomic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from bigembed.cli import main as cli_main
from bigembed.errors import InputError, OutputExistsError
from bigembed.export import export_checkpoint
from support.checkpoints import (
    USER_ITEM_RELATIONS,
    make_config,
    user_item_config,
    write_checkpoint,
    write_graph,
)

USERS = [["ann", 'bob "the builder"'], ["cé", "dan"]]  # two partitions
ITEMS = [["x1", "x2", "x3"]]


@pytest.fixture()
def checkpoint(tmp_path: Path):
    """Two entity types, partitions, global embeddings, linear + translation operators."""
    write_graph(
        tmp_path,
        {"user": USERS, "item": ITEMS},
        ["buys", "follows"],
        {"train": [("ann", "buys", "x1"), ("dan", "follows", "cé")]},
        dynamic=False,
        rel_types=USER_ITEM_RELATIONS,
    )
    cfg = user_item_config(tmp_path)
    rng = np.random.default_rng(0)
    emb = {
        ("user", 0): rng.normal(size=(2, 3)),
        ("user", 1): rng.normal(size=(2, 3)),
        ("item", 0): rng.normal(size=(3, 3)),
    }
    emb = {k: v.astype(np.float32) for k, v in emb.items()}
    params = {
        "global_embs.user": torch.tensor([1.0, 2.0, 3.0]),
        "global_embs.item": torch.tensor([-1.0, 0.5, 0.25]),
        "rhs_operators.0.linear_transformation": torch.arange(9.0).view(3, 3),
        "rhs_operators.1.translation": torch.tensor([0.1, 0.2, 0.3]),
    }
    write_checkpoint(cfg, emb, ["buys", "follows"], params=params)
    expected = {
        "user": (
            [n for part in USERS for n in part],
            np.concatenate([emb[("user", 0)], emb[("user", 1)]]) + np.float32([1, 2, 3]),
        ),
        "item": (ITEMS[0], emb[("item", 0)] + np.float32([-1.0, 0.5, 0.25])),
    }
    # the checkpoint stores its config with sorted keys: types come out in name order
    return cfg, {"item": expected["item"], "user": expected["user"]}, params


def _check_relations(rows: list[tuple[str, str, str, str, list[int], np.ndarray]], params) -> None:
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("buys", "rhs", "linear", "linear_transformation"),
        ("follows", "rhs", "translation", "translation"),
    ]
    assert rows[0][4] == [3, 3]
    np.testing.assert_array_equal(
        rows[0][5].reshape(3, 3), params["rhs_operators.0.linear_transformation"].numpy()
    )
    np.testing.assert_array_equal(rows[1][5], params["rhs_operators.1.translation"].numpy())


def _tsv_relations(path: Path):
    rows = []
    for line in path.read_text().splitlines():
        f = line.split("\t")
        rows.append(
            (f[0], f[1], f[2], f[3], [int(d) for d in f[4].split("x")], np.array(f[5:], np.float32))
        )
    return rows


def test_tsv(checkpoint, tmp_path: Path) -> None:
    cfg, expected, params = checkpoint
    export_checkpoint(cfg.checkpoint_path, "tsv", tmp_path / "out")
    lines = (tmp_path / "out" / "entities.tsv").read_text(encoding="utf-8").splitlines()
    names = [line.split("\t")[0] for line in lines]
    values = np.array([line.split("\t")[1:] for line in lines], np.float32)
    assert names == expected["item"][0] + expected["user"][0]
    np.testing.assert_array_equal(
        values, np.concatenate([expected["item"][1], expected["user"][1]])
    )
    _check_relations(_tsv_relations(tmp_path / "out" / "relation_types.tsv"), params)


def test_npy(checkpoint, tmp_path: Path) -> None:
    cfg, expected, params = checkpoint
    manifest = export_checkpoint(cfg.checkpoint_path, "npy", tmp_path / "out")
    out = tmp_path / "out"
    for etype, (names, values) in expected.items():
        np.testing.assert_array_equal(np.load(out / f"embeddings_{etype}.npy"), values)
        assert json.loads((out / f"names_{etype}.json").read_text(encoding="utf-8")) == names
    index = json.loads((out / "relation_params.json").read_text())
    arrays = np.load(out / "relation_params.npz")
    _check_relations(
        [
            (
                e["relation"],
                e["side"],
                e["operator"],
                e["param"],
                e["shape"],
                arrays[e["key"]].reshape(-1),
            )
            for e in index
        ],
        params,
    )
    assert manifest["global_embedding_added"] is True
    assert json.loads((out / "export.json").read_text())["files"] == manifest["files"]


def test_parquet(checkpoint, tmp_path: Path) -> None:
    cfg, expected, params = checkpoint
    export_checkpoint(cfg.checkpoint_path, "parquet", tmp_path / "out")
    for etype, (names, values) in expected.items():
        table = pq.read_table(tmp_path / "out" / f"embeddings_{etype}.parquet")
        assert table.column("name").to_pylist() == names
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_array_equal(got, values)
    rel = pq.read_table(tmp_path / "out" / "relation_params.parquet").to_pylist()
    _check_relations(
        [
            (
                r["relation"],
                r["side"],
                r["operator"],
                r["param"],
                r["shape"],
                np.array(r["values"], np.float32),
            )
            for r in rel
        ],
        params,
    )


def test_projector(checkpoint, tmp_path: Path) -> None:
    cfg, expected, params = checkpoint
    export_checkpoint(cfg.checkpoint_path, "projector", tmp_path / "out")
    out = tmp_path / "out"
    vectors = np.loadtxt(out / "vectors.tsv", delimiter="\t", dtype=np.float32)
    np.testing.assert_array_equal(
        vectors, np.concatenate([expected["item"][1], expected["user"][1]])
    )
    meta = (out / "metadata.tsv").read_text(encoding="utf-8").splitlines()
    assert meta[0] == "name\ttype"
    assert [m.split("\t") for m in meta[1:]] == [[n, "item"] for n in expected["item"][0]] + [
        [n, "user"] for n in expected["user"][0]
    ]
    assert 'tensor_path: "vectors.tsv"' in (out / "projector_config.pbtxt").read_text()
    _check_relations(_tsv_relations(out / "relation_types.tsv"), params)


def test_dynamic_relations_export_both_sides_with_pbg_names(tmp_path: Path) -> None:
    write_graph(tmp_path, {"node": [["a", "b"]]}, ["r0", "r1"], {"train": []}, dynamic=True)
    cfg = make_config(
        tmp_path,
        dynamic_relations=True,
        relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
    )
    diag = {
        "lhs_operators.0.diagonal": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "rhs_operators.0.diagonal": torch.tensor([[5.0, 6.0], [7.0, 8.0]]),
    }
    write_checkpoint(cfg, {("node", 0): np.eye(2, dtype=np.float32)}, ["r0", "r1"], params=diag)
    export_checkpoint(cfg.checkpoint_path, "tsv", tmp_path / "out")
    rows = [
        line.split("\t")
        for line in (tmp_path / "out" / "relation_types.tsv").read_text().splitlines()
    ]
    assert rows == [
        ["r0", "lhs", "diagonal", "diagonals", "2", "1", "2"],
        ["r1", "lhs", "diagonal", "diagonals", "2", "3", "4"],
        ["r0", "rhs", "diagonal", "diagonals", "2", "5", "6"],
        ["r1", "rhs", "diagonal", "diagonals", "2", "7", "8"],
    ]


def test_existing_output_is_refused_unless_forced(checkpoint, tmp_path: Path, capsys) -> None:
    cfg, _, _ = checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        export_checkpoint(cfg.checkpoint_path, "npy", out)
    assert cli_main(["export", cfg.checkpoint_path, "--format", "npy", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    # --force replaces only an earlier export (marked), never a directory of the user's
    assert (
        cli_main(["export", cfg.checkpoint_path, "--format", "npy", "-o", str(out), "--force"]) == 2
    )
    err = capsys.readouterr().err
    assert f"{out}: not replaced" in err and "marker" in err and len(err.splitlines()) == 1
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert cli_main(["export", cfg.checkpoint_path, "--format", "tsv", "-o", str(out)]) == 2
    out.rmdir()
    assert cli_main(["export", cfg.checkpoint_path, "--format", "tsv", "-o", str(out)]) == 0
    assert (
        cli_main(["export", cfg.checkpoint_path, "--format", "npy", "-o", str(out), "--force"]) == 0
    )
    assert not (out / "entities.tsv").exists() and (out / "embeddings_user.npy").exists()


def test_tsv_refuses_names_it_cannot_hold_and_leaves_nothing(tmp_path: Path) -> None:
    write_graph(tmp_path, {"node": [["a\tb", "c"]]}, ["all"], {"train": []}, dynamic=False)
    cfg = make_config(tmp_path)
    write_checkpoint(cfg, {("node", 0): np.zeros((2, 2), np.float32)}, ["all"])
    with pytest.raises(InputError, match="tab or line break"):
        export_checkpoint(cfg.checkpoint_path, "tsv", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
