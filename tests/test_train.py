"""The training loop end to end on small generated graphs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.checkpoints.reading import load_trained
from bigembed.checkpoints.store import CheckpointStore
from bigembed.cli import main as cli_main
from bigembed.config import ConfigSchema
from bigembed.train.single_machine import Trainer, train
from support.graphs import graph_config, write_graph


def _stats(cfg) -> list[dict]:
    return CheckpointStore(cfg.checkpoint_path).read_stats()


def test_train_writes_versioned_checkpoints(tiny_config: ConfigSchema) -> None:
    cfg = tiny_config
    result = train(cfg, progress=False)
    assert result.version == 2 and result.steps_run == 2
    store = CheckpointStore(cfg.checkpoint_path)
    assert store.committed_version() == 2
    assert store.has_partition("node", 0, 2)
    assert not store.files_of(1), "old versions are removed after a commit"
    steps = [r for r in _stats(cfg) if r["type"] == "step"]
    assert [s["version"] for s in steps] == [1, 2]
    assert steps[1]["stats"]["loss"] < steps[0]["stats"]["loss"]
    assert all(np.isfinite(s["stats"]["loss"]) for s in steps)
    model = load_trained(cfg.checkpoint_path)
    assert model.embeddings("node", 0).shape == (200, 16)


def test_resume_continues_from_last_version(tiny_graph: Path) -> None:
    first = train(graph_config(tiny_graph, num_epochs=1), progress=False)
    assert first.version == 1
    again = train(graph_config(tiny_graph, num_epochs=1), progress=False)
    assert again.steps_run == 0, "a finished run has nothing left to do"
    more = train(graph_config(tiny_graph, num_epochs=3), progress=False)
    assert more.steps_run == 2 and more.version == 3
    versions = [r["version"] for r in _stats(graph_config(tiny_graph)) if r["type"] == "step"]
    assert versions == [1, 2, 3], "stats are neither lost nor duplicated across a resume"


def test_single_worker_is_reproducible(tmp_path: Path) -> None:
    embs = []
    for run in ("a", "b"):
        root = tmp_path / run
        write_graph(root)
        cfg = graph_config(root, num_epochs=2, seed=5)
        train(cfg, progress=False)
        embs.append(load_trained(cfg.checkpoint_path).embeddings("node", 0).clone())
    assert torch.equal(embs[0], embs[1])


@pytest.mark.parametrize("order", ["random", "affinity", "inside_out", "outside_in", "buffer"])
def test_out_of_core_every_bucket_once(tmp_path: Path, order: str) -> None:
    write_graph(tmp_path, num_entities=400, num_edges=4000, num_partitions=4)
    cfg = graph_config(tmp_path, num_partitions=4, num_epochs=2, bucket_order=order)
    trainer = Trainer(cfg, progress=False, capacity=2)  # a budget of one bucket
    result = trainer.train()
    # Invariant 1: every bucket of every epoch trained exactly once.
    for version in (1, 2):
        seen = [
            (r["lhs_partition"], r["rhs_partition"])
            for r in _stats(cfg)
            if r["type"] == "bucket" and r["version"] == version
        ]
        expected = [
            (i, j) for i in range(4) for j in range(4) if trainer.edge_stores[0].num_edges(i, j) > 0
        ]
        assert sorted(seen) == sorted(expected)
    # Out-of-core: the embeddings held at once never exceed 2 of the 4 partitions.
    per_partition = result.total_partition_bytes / 4
    assert result.peak_partition_bytes <= 2 * per_partition * 1.05
    assert result.peak_partition_bytes > 0


@pytest.mark.parametrize(
    "operator", ["none", "translation", "diagonal", "linear", "affine", "complex_diagonal"]
)
@pytest.mark.parametrize("dynamic", [True, False])
def test_every_operator_trains(tmp_path: Path, operator: str, dynamic: bool) -> None:
    write_graph(tmp_path, num_edges=1500)
    if dynamic:
        cfg = graph_config(
            tmp_path,
            num_epochs=1,
            relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": operator}],
        )
    else:
        cfg = graph_config(
            tmp_path,
            num_epochs=1,
            dynamic_relations=False,
            relations=[
                {"name": f"r{k}", "lhs": "node", "rhs": "node", "operator": operator}
                for k in range(3)
            ],
        )
    result = train(cfg, progress=False)
    assert np.isfinite(result.last_step.stats.loss)


@pytest.mark.parametrize("comparator", ["dot", "cos", "l2", "squared_l2"])
@pytest.mark.parametrize("loss", ["ranking", "logistic", "softmax"])
def test_every_comparator_and_loss_trains(tmp_path: Path, comparator: str, loss: str) -> None:
    write_graph(tmp_path, num_edges=1500, weights=True)
    cfg = graph_config(
        tmp_path,
        num_epochs=1,
        comparator=comparator,
        loss_fn=loss,
        bias=comparator == "dot",
        regularization_coef=1e-3,
        max_norm=1.0 if comparator == "l2" else None,
    )
    result = train(cfg, progress=False)
    assert np.isfinite(result.last_step.stats.loss)


def test_standard_mode_all_negs_global_emb_disabled_side(tmp_path: Path) -> None:
    write_graph(tmp_path, num_edges=1500)
    cfg = graph_config(
        tmp_path,
        num_epochs=1,
        dynamic_relations=False,
        global_emb=True,
        disable_lhs_negs=True,
        relations=[
            {
                "name": "r0",
                "lhs": "node",
                "rhs": "node",
                "operator": "translation",
                "all_negs": True,
            },
            {"name": "r1", "lhs": "node", "rhs": "node", "operator": "diagonal", "weight": 0.5},
            {"name": "r2", "lhs": "node", "rhs": "node", "operator": "none"},
        ],
    )
    result = train(cfg, progress=False)
    assert np.isfinite(result.last_step.stats.loss)
    assert result.last_step.stats.violators_lhs == 0  # lhs negatives disabled


def test_withheld_eval_improves(tmp_path: Path) -> None:
    write_graph(tmp_path, num_entities=100, num_edges=6000)
    cfg = graph_config(
        tmp_path, num_epochs=4, eval_fraction=0.1, eval_num_batch_negs=50, eval_num_uniform_negs=50
    )
    train(cfg, progress=False)
    steps = [r for r in _stats(cfg) if r["type"] == "step"]
    first, last = steps[0]["eval_stats_before"], steps[-1]["eval_stats_after"]
    assert last["mrr"] > first["mrr"] + 0.1
    assert 0.0 <= last["auc"] <= 1.0 and last["count"] == first["count"]


def test_init_path_warm_start(tiny_graph: Path) -> None:
    base = graph_config(tiny_graph, num_epochs=1)
    train(base, progress=False)
    warm = graph_config(
        tiny_graph,
        num_epochs=1,
        checkpoint_path=str(tiny_graph / "warm"),
        init_path=base.checkpoint_path,
        lr=0.0,
        relation_lr=0.0,
    )
    train(warm, progress=False)
    a = load_trained(base.checkpoint_path).embeddings("node", 0)
    b = load_trained(warm.checkpoint_path).embeddings("node", 0)
    assert torch.equal(a, b)


def test_checkpoint_preservation(tiny_graph: Path) -> None:
    cfg = graph_config(tiny_graph, num_epochs=3, checkpoint_preservation_interval=2)
    train(cfg, progress=False)
    snap = Path(cfg.checkpoint_path) / "epoch_2"
    assert (snap / "checkpoint_version.txt").read_text().strip() == "2"
    assert load_trained(snap).version == 2
    assert not (Path(cfg.checkpoint_path) / "epoch_1").exists()


@pytest.mark.integration
def test_two_hogwild_workers(tmp_path: Path) -> None:
    write_graph(tmp_path, num_edges=6000)
    cfg = graph_config(tmp_path, num_epochs=2, workers=2, num_partitions=1)
    result = train(cfg, progress=False)
    steps = [r for r in _stats(cfg) if r["type"] == "step"]
    assert result.version == 2 and steps[-1]["stats"]["count"] == 6000
    assert steps[1]["stats"]["loss"] < steps[0]["stats"]["loss"]


def test_train_and_plot_cli(tiny_graph: Path, capsys) -> None:
    cfg = graph_config(tiny_graph, num_epochs=2, eval_fraction=0.1)
    cfg_path = tiny_graph / "config.json"
    from bigembed.config import config_to_dict

    cfg_path.write_text(json.dumps(config_to_dict(cfg)))
    assert cli_main(["train", str(cfg_path), "--no-progress"]) == 0
    assert "checkpoint version 2" in capsys.readouterr().out
    assert cli_main(["plot", cfg.checkpoint_path, "-o", str(tiny_graph / "curves.png")]) == 0
    png = (tiny_graph / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_mismatched_graph_is_a_clear_error(tiny_graph: Path, capsys) -> None:
    cfg = graph_config(tiny_graph, num_partitions=2)
    cfg_path = tiny_graph / "config.json"
    from bigembed.config import config_to_dict

    cfg_path.write_text(json.dumps(config_to_dict(cfg)))
    assert cli_main(["train", str(cfg_path), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "num_partitions" in err and "Traceback" not in err


@pytest.mark.integration
def test_kill9_at_random_moments_then_resume(tmp_path: Path) -> None:
    """Invariant 3: a run killed at any moment restarts from a complete checkpoint."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    from bigembed.config import config_to_dict

    write_graph(tmp_path, num_entities=2000, num_edges=40000)
    cfg = graph_config(tmp_path, num_epochs=6, dimension=64, num_edge_chunks=2, workers=2)
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(config_to_dict(cfg)))
    cmd = [sys.executable, "-m", "bigembed.cli", "train", str(cfg_path), "--no-progress"]
    store = CheckpointStore(cfg.checkpoint_path)
    rng = random.Random(1234)
    for _trial in range(3):
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(rng.uniform(1.0, 4.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        version = store.committed_version()
        if version:  # whatever is committed is complete and loadable
            model = load_trained(cfg.checkpoint_path)
            assert model.version == version
            assert torch.isfinite(model.embeddings("node", 0)).all()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert store.committed_version() == 12
    versions = [r["version"] for r in store.read_stats() if r["type"] == "step"]
    assert versions == sorted(set(versions)) and versions[-1] == 12
    leftovers = [p.name for p in Path(cfg.checkpoint_path).iterdir() if p.name.endswith(".tmp")]
    assert not leftovers
    assert not store.files_of(13)


def test_bfloat16_compute_mode_trains(tmp_path: Path) -> None:
    write_graph(tmp_path, num_edges=1500)
    cfg = graph_config(tmp_path, num_epochs=2, compute_dtype="bfloat16")
    result = train(cfg, progress=False)
    steps = [r for r in _stats(cfg) if r["type"] == "step"]
    assert steps[1]["stats"]["loss"] < steps[0]["stats"]["loss"]
    emb = load_trained(cfg.checkpoint_path).embeddings("node", 0)
    assert emb.dtype == torch.float32, "master weights stay fp32"
    assert result.version == 2


def test_pbg_uniform_negative_groups(tmp_path: Path) -> None:
    write_graph(tmp_path, num_edges=1500)
    cfg = graph_config(tmp_path, num_epochs=1, uniform_negs_group=20)
    assert np.isfinite(train(cfg, progress=False).last_step.stats.loss)
