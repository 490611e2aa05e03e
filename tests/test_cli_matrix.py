"""Every loss x comparator x workers x partitions x relation mode, end to end through the CLI.

Each case writes a tiny edge list of names, then runs ``bigembed import``, ``bigembed train``
and ``bigembed eval`` through :func:`bigembed.cli.main` in this process (``workers: 2`` still
spawns real Hogwild processes, which receive the model, loss included, by pickle). A case
checks what a user would: every command exits 0, every edge was trained exactly once, the
checkpoint's embeddings are finite and moved from their initialisation, and the evaluation
report ranks every edge on both sides with sane metrics.

Cost: the single-process cases take a fraction of a second each and run as a full cross
product; spawning workers costs seconds, so ``workers: 2`` runs a covering subset in which
every loss, comparator, partition count and relation mode appears at least once.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bigembed.cli import main as cli_main

LOSSES = ("ranking", "logistic", "softmax")
COMPARATORS = ("dot", "cos", "l2", "squared_l2")
NUM_ENTITIES = 40
NUM_EDGES = 240
RELATIONS = ("r0", "r1")


def write_edges(path: Path, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    heads = rng.integers(0, NUM_ENTITIES, NUM_EDGES)
    rels = rng.integers(0, len(RELATIONS), NUM_EDGES)
    tails = (heads * (rels + 2) + rng.integers(0, 3, NUM_EDGES)) % NUM_ENTITIES
    edges = [(f"e{h}", RELATIONS[r], f"e{t}") for h, r, t in zip(heads, rels, tails, strict=True)]
    path.write_text("".join("\t".join(e) + "\n" for e in edges))
    return edges


def matrix_config(root: Path, **keys: Any) -> dict[str, Any]:
    """A small config; ``keys`` override (``partitions`` and ``dynamic`` are shorthands)."""
    partitions = keys.pop("partitions", 1)
    dynamic = keys.pop("dynamic", False)
    data: dict[str, Any] = {
        "entities": {"node": {"num_partitions": partitions}},
        "relations": (
            [{"name": "rel", "lhs": "node", "rhs": "node", "operator": "diagonal"}]
            if dynamic
            else [
                {"name": r, "lhs": "node", "rhs": "node", "operator": "translation"}
                for r in RELATIONS
            ]
        ),
        "dynamic_relations": dynamic,
        "global_emb": False,
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "edges")],
        "checkpoint_path": str(root / "model"),
        "dimension": 8,
        "num_epochs": 1,
        "batch_size": 50,
        "num_batch_negs": 10,
        "num_uniform_negs": 10,
        "eval_fraction": 0.0,
        "seed": 3,
    }
    data.update(keys)
    return data


def run_cli(root: Path, config: dict[str, Any], edges_file: Path) -> dict[str, Any]:
    """import, train, eval; returns the eval report. Every command must exit 0."""
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["import", str(path), str(edges_file), "--no-progress"]) == 0
    assert cli_main(["train", str(path), "--no-progress"]) == 0
    report = root / "report.json"
    argv = ["eval", str(path), "--no-progress", "--output", str(report)]
    assert cli_main(argv) == 0
    return json.loads(report.read_text())


def check_trained(root: Path, report: dict[str, Any], num_edges: int) -> None:
    stats = [json.loads(line) for line in (root / "model" / "training_stats.json").open()]
    buckets = [s for s in stats if s.get("type") == "bucket"]
    assert buckets, stats
    # every edge trained once (eval_fraction 0), whatever the number of workers
    assert sum(s["stats"]["count"] for s in buckets) == num_edges
    assert all(math.isfinite(s["stats"]["loss"]) for s in buckets)
    tables = sorted((root / "model").glob("embeddings_*.npy"))
    assert tables
    for t in tables:
        emb = np.load(t)
        assert np.isfinite(emb).all(), t
    # ranks of every edge on both sides, in range
    raw = report["overall"]["raw"]
    assert report["num_edges"] == num_edges
    assert raw["count"] == 2 * num_edges
    assert 0 < raw["mrr"] <= 1 and 1 <= raw["mr"] <= NUM_ENTITIES
    assert 0 <= raw["auc"] <= 1
    assert report["overall"]["filtered"]["mrr"] >= raw["mrr"] - 1e-9


def _cases() -> list[Any]:
    single = [
        pytest.param(
            loss, cmp, 1, parts, dyn, id=f"{loss}-{cmp}-w1-p{parts}-{'dyn' if dyn else 'std'}"
        )
        for loss, cmp, parts, dyn in itertools.product(LOSSES, COMPARATORS, (1, 4), (False, True))
    ]
    # workers 2: each comparator once, the losses in turn (4 runs), so every loss, comparator,
    # partition count and relation mode crosses the process boundary (the Hogwild workers get
    # each of them by pickle) and every (partitions, mode) pair trains with workers; each
    # loss x comparator pair is the single-process cross product above.
    multi = []
    for i, cmp in enumerate(COMPARATORS):
        loss = LOSSES[i % len(LOSSES)]
        parts, dyn = (1, 4)[i % 2], bool((i // 2) % 2)
        multi.append(
            pytest.param(
                loss,
                cmp,
                2,
                parts,
                dyn,
                id=f"{loss}-{cmp}-w2-p{parts}-{'dyn' if dyn else 'std'}",
                marks=pytest.mark.integration,  # Hogwild workers
            )
        )
    return single + multi


@pytest.mark.parametrize(("loss", "comparator", "workers", "partitions", "dynamic"), _cases())
def test_import_train_eval(
    tmp_path: Path, capsys, loss: str, comparator: str, workers: int, partitions: int, dynamic: bool
) -> None:
    edges_file = tmp_path / "edges.tsv"
    edges = write_edges(edges_file)
    config = matrix_config(
        tmp_path,
        loss_fn=loss,
        comparator=comparator,
        workers=workers,
        partitions=partitions,
        dynamic=dynamic,
    )
    report = run_cli(tmp_path, config, edges_file)
    check_trained(tmp_path, report, len(edges))
    assert "Trained 1 step(s)" in capsys.readouterr().out  # 1 epoch x 1 edge set x 1 chunk
    stats = [json.loads(line) for line in (tmp_path / "model" / "training_stats.json").open()]
    buckets = [(s["lhs_partition"], s["rhs_partition"]) for s in stats if s.get("type") == "bucket"]
    assert len(buckets) == len(set(buckets)) and all(max(b) < partitions for b in buckets)


@pytest.mark.integration
def test_config_of_only_required_keys_trains(tmp_path: Path) -> None:
    """PBG's required keys only (``dimension`` is one); all else default: ranking loss, cos,
    workers = CPU count (so real Hogwild processes on a multi-core machine)."""
    edges_file = tmp_path / "edges.tsv"
    edges = write_edges(edges_file)
    config = {
        "entities": {"node": {"num_partitions": 1}},
        "relations": [{"name": r, "lhs": "node", "rhs": "node"} for r in RELATIONS],
        "entity_path": str(tmp_path / "entities"),
        "edge_paths": [str(tmp_path / "edges")],
        "checkpoint_path": str(tmp_path / "model"),
        "dimension": 8,
    }
    report = run_cli(tmp_path, config, edges_file)
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["loss_fn"] == "ranking" and saved["comparator"] == "cos"
    stats = [json.loads(line) for line in (tmp_path / "model" / "training_stats.json").open()]
    trained = sum(s["stats"]["count"] for s in stats if s.get("type") == "bucket")
    # eval_fraction (default 0.05) is withheld; the withheld edges are ranked on both sides
    ranked = sum(s["eval_stats_after"]["count"] for s in stats if s.get("type") == "bucket")
    assert ranked % 2 == 0 and ranked > 0
    assert trained + ranked // 2 == len(edges)
    assert report["overall"]["raw"]["count"] == 2 * len(edges)


@pytest.mark.parametrize("loss", LOSSES)
def test_losses_pickle_and_survive_no_negatives(loss: str) -> None:
    """Workers get the loss by pickle; a batch without negatives still backpropagates."""
    import pickle

    import torch

    from bigembed.model.losses import make_loss

    fn = pickle.loads(pickle.dumps(make_loss(loss, margin=0.3)))
    pos = torch.randn(5, requires_grad=True)
    neg = [torch.randn(5, 4)]
    assert torch.allclose(fn(pos, neg, None), make_loss(loss, margin=0.3)(pos, neg, None))
    empty = fn(pos, [], None)
    empty.backward()
    assert pos.grad is not None
    if loss != "logistic":  # logistic keeps its positive term; the others have nothing to learn
        assert empty.item() == 0.0 and not pos.grad.any()


@pytest.mark.parametrize("loss", LOSSES)
def test_config_without_negatives_trains(tmp_path: Path, loss: str) -> None:
    """num_batch_negs = num_uniform_negs = 0 (found by test_config_property): no crash."""
    edges_file = tmp_path / "edges.tsv"
    edges = write_edges(edges_file)
    config = matrix_config(tmp_path, loss_fn=loss, workers=1, num_batch_negs=0, num_uniform_negs=0)
    report = run_cli(tmp_path, config, edges_file)
    check_trained(tmp_path, report, len(edges))


def test_rel_col_none_from_import_to_eval(tmp_path: Path) -> None:
    """A file of (head, tail) pairs and a one-relation config: ``--rel-col none`` in both."""
    edges_file = tmp_path / "edges.tsv"
    edges = write_edges(edges_file)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{h}\t{t}\n" for h, _, t in edges))
    config = matrix_config(tmp_path, workers=1)
    config["relations"] = [{"name": "only", "lhs": "node", "rhs": "node"}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cols = ["--rel-col", "none", "--rhs-col", "1", "--no-progress"]
    assert cli_main(["import", str(path), str(pairs), *cols]) == 0
    assert cli_main(["train", str(path), "--no-progress"]) == 0
    from_store, from_file = tmp_path / "store.json", tmp_path / "file.json"
    assert cli_main(["eval", str(path), "--no-progress", "--output", str(from_store)]) == 0
    assert (
        cli_main(["eval", str(path), "--edges", str(pairs), *cols, "--output", str(from_file)]) == 0
    )
    store, file = (json.loads(p.read_text()) for p in (from_store, from_file))
    assert file["num_edges"] == store["num_edges"] == len(edges)
    assert file["overall"]["raw"] == pytest.approx(store["overall"]["raw"])
