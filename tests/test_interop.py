"""``bigembed convert``: PyTorch-BigGraph checkpoints in and out, exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bigembed
from bigembed.checkpoints.reading import load_trained, open_entity_store
from bigembed.cli import main as cli_main
from bigembed.errors import BigembedError, OutputExistsError
from bigembed.interop.pbg import BIGEMBED_ONLY_KEYS, from_pbg, to_pbg
from support.checkpoints import make_config, trained_graph, write_checkpoint, write_graph

h5py = pytest.importorskip("h5py")


def _standard_checkpoint(root: Path):
    write_graph(
        root,
        {"user": [["ann", "bob"], ["cé", "dan", "eve"]], "item": [["x1", "x2"]]},
        ["buys", "follows"],
        {"train": [("ann", "buys", "x1")]},
        dynamic=False,
        rel_types={"buys": ("user", "item"), "follows": ("user", "user")},
    )
    cfg = make_config(
        root,
        dimension=3,
        global_emb=True,
        seed=7,
        entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
        relations=[
            {"name": "buys", "lhs": "user", "rhs": "item", "operator": "linear"},
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
        ],
    )
    rng = np.random.default_rng(0)
    emb = {
        ("user", 0): rng.normal(size=(2, 3)),
        ("user", 1): rng.normal(size=(3, 3)),
        ("item", 0): rng.normal(size=(2, 3)),
    }
    params = {
        "global_embs.user": torch.tensor([1.0, 2.0, 3.0]),
        "rhs_operators.0.linear_transformation": torch.randn(3, 3),
        "rhs_operators.1.translation": torch.randn(3),
    }
    write_checkpoint(
        cfg,
        {k: v.astype(np.float32) for k, v in emb.items()},
        ["buys", "follows"],
        params=params,
        version=4,
    )
    return cfg


def _assert_same(a_dir: str, b_dir: str) -> None:
    a, b = load_trained(a_dir), load_trained(b_dir)
    assert a.version == b.version
    assert a.entity_counts == b.entity_counts
    assert a.metadata.iteration == b.metadata.iteration  # travels as PBG's iteration/* attrs
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    for etype, part in a.entity_counts:
        assert torch.equal(a.embeddings(etype, part), b.embeddings(etype, part))
        ea, eb = open_entity_store(a), open_entity_store(b)
        assert ea.names(etype, part) == eb.names(etype, part)
    assert a.relation_names == b.relation_names or not a.config.dynamic_relations
    da, db = a.config.model_dump(), b.config.model_dump()
    for key in ("entity_path", "checkpoint_path"):
        da.pop(key), db.pop(key)
    assert da == db


def test_round_trip_standard_mode(tmp_path: Path) -> None:
    cfg = _standard_checkpoint(tmp_path)
    to_pbg(cfg.checkpoint_path, None, tmp_path / "pbg", tmp_path / "pbg_ent")
    from_pbg(tmp_path / "pbg", tmp_path / "pbg_ent", tmp_path / "back", tmp_path / "back_ent")
    _assert_same(cfg.checkpoint_path, str(tmp_path / "back"))
    back = load_trained(tmp_path / "back")
    assert back.config.entity_path == str(tmp_path / "back_ent")
    assert back.metadata.iteration.num_edge_chunks == 1  # what write_checkpoint records
    assert (back.metadata.converted_from or {}).get("system") == "PyTorch-BigGraph"
    assert back.config.seed == 7  # a bigembed-only key survives via the side file


def test_written_pbg_layout(tmp_path: Path) -> None:
    cfg = _standard_checkpoint(tmp_path)
    to_pbg(cfg.checkpoint_path, None, tmp_path / "pbg", tmp_path / "pbg_ent")
    pbg, ent = tmp_path / "pbg", tmp_path / "pbg_ent"
    assert (pbg / "checkpoint_version.txt").read_text().strip() == "4"
    config = json.loads((pbg / "config.json").read_text())
    assert not set(BIGEMBED_ONLY_KEYS) & set(config)
    from bigembed.config import BIGEMBED_ONLY_KEYS as CONFIG_ONLY

    assert not {k for k in CONFIG_ONLY if "." not in k} & set(config)  # e.g. memory_budget
    assert config["entity_path"] == str(ent)
    assert json.loads((ent / "entity_names_user_1.json").read_text()) == ["cé", "dan", "eve"]
    assert (ent / "entity_count_user_1.txt").read_text().strip() == "3"
    with h5py.File(pbg / "embeddings_user_1.v4.h5", "r") as f:
        assert f.attrs["format_version"] == 1 and f["embeddings"].shape == (3, 3)
        assert f["embeddings"].dtype == np.float32
    with h5py.File(pbg / "model.v4.h5", "r") as f:
        keys = {}
        f["model"].visititems(
            lambda n, o: (
                keys.update({n: o.attrs["state_dict_key"]}) if isinstance(o, h5py.Dataset) else None
            )
        )
    assert keys == {
        "relations/0/operator/rhs/linear_transformation": "rhs_operators.0.linear_transformation",
        "relations/1/operator/rhs/translation": "rhs_operators.1.translation",
        "entities/user/global_embedding": "global_embs.emb_user",
        "entities/item/global_embedding": "global_embs.emb_item",
    }


def test_round_trip_dynamic_trained_model(tmp_path: Path) -> None:
    cfg, edges = trained_graph(tmp_path)
    assert (
        cli_main(
            [
                "convert",
                "to-pbg",
                cfg.checkpoint_path,
                "-",
                str(tmp_path / "pbg"),
                str(tmp_path / "pbg_ent"),
            ]
        )
        == 0
    )
    assert (
        cli_main(
            [
                "convert",
                "from-pbg",
                str(tmp_path / "pbg"),
                str(tmp_path / "pbg_ent"),
                str(tmp_path / "back"),
                str(tmp_path / "back_ent"),
            ]
        )
        == 0
    )
    _assert_same(cfg.checkpoint_path, str(tmp_path / "back"))
    a, b = bigembed.load(cfg.checkpoint_path), bigembed.load(tmp_path / "back")
    h, r, _ = edges[0]
    assert a.predict(h, r, k=5) == b.predict(h, r, k=5)


def _write_pbg_fixture(root: Path) -> dict:
    """A checkpoint as PBG itself writes it (pbg.md §3): dynamic relations, plural names."""
    ck, ent = root / "ck", root / "ent"
    ck.mkdir()
    ent.mkdir()
    config = {  # PBG's own keys only
        "entities": {"all": {"num_partitions": 2, "featurized": False, "dimension": None}},
        "relations": [
            {
                "name": "all_edges",
                "lhs": "all",
                "rhs": "all",
                "weight": 1.0,
                "operator": "diagonal",
                "all_negs": False,
            }
        ],
        "dimension": 4,
        "global_emb": False,
        "comparator": "dot",
        "dynamic_relations": True,
        "entity_path": "data/FB15k",
        "edge_paths": ["data/FB15k/train_partitioned"],
        "checkpoint_path": "model/fb15k",
        "num_epochs": 3,
        "loss_fn": "softmax",
        "lr": 0.1,
        "num_uniform_negs": 1000,
        "hogwild_delay": 2.0,
        "verbose": 0,
    }
    (ck / "config.json").write_text(json.dumps(config, indent=4))
    (ck / "checkpoint_version.txt").write_text("6")
    names = [["a", "b", "c"], ["d", "e"]]
    rng = np.random.default_rng(3)
    embs = [rng.normal(size=(len(n), 4)).astype(np.float32) for n in names]
    attrs = {"format_version": 1, "config/json": json.dumps(config), "iteration/epoch_idx": 1}
    for part, (n, e) in enumerate(zip(names, embs, strict=True)):
        (ent / f"entity_count_all_{part}.txt").write_text(f"{len(n)}\n")
        (ent / f"entity_names_all_{part}.json").write_text(json.dumps(n))
        with h5py.File(ck / f"embeddings_all_{part}.v6.h5", "w") as f:
            f.attrs.update(attrs)
            f.create_dataset("embeddings", data=e)
            f.create_dataset("optimizer/state_dict", data=np.frombuffer(b"opaque", dtype="V1"))
    (ent / "dynamic_rel_count.txt").write_text("3\n")
    (ent / "dynamic_rel_names.json").write_text(json.dumps(["r_a", "r_b", "r_c"]))
    diag = {side: rng.normal(size=(3, 4)).astype(np.float32) for side in ("lhs", "rhs")}
    with h5py.File(ck / "model.v6.h5", "w") as f:
        f.attrs.update(attrs)
        g = f.create_group("model")
        for side, values in diag.items():
            ds = g.create_dataset(f"relations/0/operator/{side}/diagonals", data=values)
            ds.attrs["state_dict_key"] = f"{side}_operators.0.diagonals"
        f.create_dataset("optimizer/state_dict", data=np.frombuffer(b"opaque", dtype="V1"))
    return {"names": names, "embs": embs, "diag": diag}


def test_reads_a_checkpoint_written_by_pbg(tmp_path: Path) -> None:
    fx = _write_pbg_fixture(tmp_path)
    summary = from_pbg(tmp_path / "ck", tmp_path / "ent", tmp_path / "out", tmp_path / "out_ent")
    assert summary["version"] == 6 and summary["relations"] == 3
    trained = load_trained(tmp_path / "out")
    assert trained.version == 6 and trained.config.num_epochs == 3
    state = trained.model.state_dict()
    for side in ("lhs", "rhs"):
        got = state[f"{side}_operators.0.diagonal"].numpy()
        np.testing.assert_array_equal(got, fx["diag"][side])
    for part, emb in enumerate(fx["embs"]):
        np.testing.assert_array_equal(trained.embeddings("all", part).numpy(), emb)
    model = bigembed.load(tmp_path / "out")
    assert model.entity_names() == ["a", "b", "c", "d", "e"]
    assert model.relation_names == ["r_a", "r_b", "r_c"]
    # scores follow PBG's dynamic formula: tails ranked by <y, d_lhs[r] * x>
    x = fx["embs"][0][1]
    expected = fx["embs"][1] @ (fx["diag"]["lhs"][2] * x)
    np.testing.assert_allclose(model.score("b", "r_c", ["d", "e"], side="rhs"), expected, rtol=1e-5)
    assert len(model.predict("b", "r_c", k=5, include_self=True)) == 5


def _craft(path: Path, kind: str, outside: Path, name: str = "embeddings") -> None:
    """Rewrite ``path`` so that dataset ``name`` takes its bytes from the file ``outside``
    (an HDF5 file with a dataset ``data`` of shape (3, 4), or raw float32 bytes for "external")."""
    with h5py.File(path, "a") as f:
        del f[name]
        if kind == "external":  # raw storage in an arbitrary file
            f.create_dataset(name, shape=(3, 4), dtype="f4", external=[(str(outside), 0, 48)])
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(3, 4), dtype="f4")
            layout[:] = h5py.VirtualSource(str(outside), "data", shape=(3, 4))
            f.create_virtual_dataset(name, layout)
        elif kind == "external_link":
            f[name] = h5py.ExternalLink(str(outside), "/data")
        elif kind == "soft_link":
            f.create_dataset("elsewhere", data=np.zeros((3, 4), dtype="f4"))
            f[name] = h5py.SoftLink("/elsewhere")


@pytest.mark.parametrize("kind", ["external", "virtual", "external_link", "soft_link"])
@pytest.mark.parametrize("target", ["embeddings", "model"])
def test_refuses_data_from_outside_the_file(tmp_path: Path, kind: str, target: str, capsys) -> None:
    """A crafted checkpoint must not make the converter copy another local file's bytes."""
    _write_pbg_fixture(tmp_path)
    private = np.arange(12, dtype=np.float32).reshape(3, 4)  # "an arbitrary local file"
    if kind == "external":
        outside = tmp_path / "private.bin"
        outside.write_bytes(private.tobytes())
    else:
        outside = tmp_path / "private.h5"
        with h5py.File(outside, "w") as f:
            f.create_dataset("data", data=private)
    if target == "embeddings":
        path, name = tmp_path / "ck" / "embeddings_all_0.v6.h5", "embeddings"
    else:
        path, name = tmp_path / "ck" / "model.v6.h5", "model/relations/0/operator/lhs/diagonals"
    _craft(path, kind, outside, name)
    if kind != "soft_link":  # the crafted file really reads the outside bytes
        with h5py.File(path, "r") as f:
            np.testing.assert_array_equal(f[name][...], private)
    rc = cli_main(
        [
            "convert",
            "from-pbg",
            str(tmp_path / "ck"),
            str(tmp_path / "ent"),
            str(tmp_path / "o"),
            str(tmp_path / "oe"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1, err
    assert str(path) in err[0] and f"/{name}" in err[0]
    assert ("soft link" if kind == "soft_link" else "outside the checkpoint file") in err[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / "oe").exists()


def test_errors_are_clear(tmp_path: Path, monkeypatch, capsys) -> None:
    _write_pbg_fixture(tmp_path)
    (tmp_path / "ck" / "checkpoint_version.txt").unlink()
    rc = cli_main(
        [
            "convert",
            "from-pbg",
            str(tmp_path / "ck"),
            str(tmp_path / "ent"),
            str(tmp_path / "o"),
            str(tmp_path / "oe"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "checkpoint_version.txt" in err[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / "oe").exists()
    (tmp_path / "taken").mkdir()
    with pytest.raises(OutputExistsError):
        from_pbg(tmp_path / "ck", tmp_path / "ent", tmp_path / "taken", tmp_path / "oe")
    monkeypatch.setitem(sys.modules, "h5py", None)  # as if h5py were not installed
    with pytest.raises(BigembedError, match=r"bigembed\[h5\]"):
        from_pbg(tmp_path / "ck", tmp_path / "ent", tmp_path / "o", tmp_path / "oe")
