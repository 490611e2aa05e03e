"""Distributed runs with shared parameters, end to end: a graph whose unpartitioned item table
is shared by every trainer (:func:`write_items_graph`) and a ``bigembed launch`` of it that returns
what the run committed and measured (:func:`launch_ranks`).

Shared by test_comm_dist (a precision against fp32) and test_strategies (a strategy against one
machine).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigembed.checkpoints import CheckpointStore
from support.graphs import graph_config, planted, save_config, write_buckets
from support.ranks import TIMEOUT, run

# the line each trainer prints at the end of a run with shared parameters
_SHARED = re.compile(
    r"shared parameters \(\w+, (\w+)\): (\d+) rounds, (\d+) bytes sent, (\d+) bytes"
)


ITEMS, USERS = 200, 300  # the sizes of write_items_graph's types
EPOCHS = 4  # of a launch_ranks run (the withheld MRR is flat from the 2nd epoch on)


def write_items_graph(root: Path) -> dict[str, Any]:
    """user (2 partitions) -> item (unpartitioned: the item table and its row accumulators are
    shared parameters); 4 dynamic relations, 2 per bucket."""
    rng = np.random.default_rng(2)

    def bucket(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [planted(rng, USERS, ITEMS, 10000, r) for r in (2 * p, 2 * p + 1)]
        lhs, rel, rhs = (np.concatenate(cols) for cols in zip(*parts, strict=True))
        return lhs, rel, rhs

    write_buckets(
        root,
        {"user": [USERS, USERS], "item": [ITEMS]},
        [f"r{k}" for k in range(4)],
        True,
        {(p, 0): bucket(p) for p in (0, 1)},
        (2, 1),
    )
    return {
        "entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
        "relations": [{"name": "all", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
    }


def launch_ranks(
    root: Path,
    graph: dict[str, Any],
    precision: str,
    strategy: str = "async_ps",
    ranks: int = 2,
    overrides: tuple[str, ...] = (),
) -> tuple[dict[str, torch.Tensor], tuple[float, float], list[float]]:
    """A ``bigembed launch`` of ``ranks`` trainers (1: ``bigembed train``) on the graph under
    ``root``; returns the committed model
    (and unpartitioned tables' embeddings and accumulators), the withheld edges' MRR and AUC in
    the last 3 epochs and, per trainer, the shared-parameter bytes per sharer round."""
    cfg = graph_config(
        root,
        **graph,
        num_epochs=EPOCHS,
        dimension=16,
        eval_fraction=0.1,
        num_partition_servers=0,  # only the shared parameters cross the network
        # These runs test learning, not fault detection: a deadline that a loaded CI machine
        # (two test files at once) cannot trip on a slow but healthy synchronous round.
        distributed_timeout=4 * TIMEOUT,
        checkpoint_path=str(root / f"{strategy}-{precision}-{ranks}"),
    )
    cfg_path = save_config(root, cfg)
    argv = ["launch", str(cfg_path), "-n", str(ranks), "-p", f"communication.precision={precision}"]
    argv += ["-p", f"communication.strategy={strategy}"]
    for override in overrides:
        argv += ["-p", override]
    if ranks == 1:  # one machine: `bigembed train`, no communication
        argv = ["train", str(cfg_path), "--no-progress", *argv[4:]]
    out = run(argv)
    assert out.returncode == 0, out.stdout + out.stderr
    per_round = [
        (int(sent) + int(received)) / int(rounds)
        for codec, rounds, sent, received in _SHARED.findall(out.stdout + out.stderr)
        if codec == precision
    ]
    if ranks > 1:
        assert len(per_round) == ranks, out.stdout + out.stderr  # one line per trainer
    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    values = dict(store.load_model(version)["model"])
    for etype, ent in cfg.entities.items():
        if ent.num_partitions == 1:
            emb, state = torch.empty(ITEMS, 16), torch.empty(ITEMS)
            store.load_partition(etype, 0, version, emb, state)
            values.update({f"{etype}_emb": emb, f"{etype}_state": state})
    rows = [r for r in store.read_stats() if r["type"] == "bucket" and r["epoch_idx"] >= EPOCHS - 3]
    if ranks > 1:  # every trainer trained (and shared)
        assert {r["trainer"] for r in rows} == set(range(ranks)), rows
    count = sum(r["eval_stats_after"]["count"] for r in rows)
    mrr, auc = (
        sum(r["eval_stats_after"][m] * r["eval_stats_after"]["count"] for r in rows) / count
        for m in ("mrr", "auc")
    )
    return values, (mrr, auc), per_round
