"""``bigembed eval --protocol sampled`` against a reference written here in plain torch.

The reference follows the documented protocol (docs/evaluation.md), independently of
bigembed's scoring code: edges are taken bucket by bucket in storage order, cut into batches of
``batch_size`` (rounded up to a multiple of ``num_batch_negs``) and chunks of
``num_batch_negs``; each positive is ranked against the other positives of its chunk (batch
negatives) or against every entity of the corrupted side's partition but itself (``all_negs``),
and rank = 1 + the number of negatives scoring >= the positive. Uniform negatives are off, so
the negatives are deterministic and the metrics must agree exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.checkpoints.reading import load_trained
from bigembed.cli import main as cli_main
from bigembed.storage.edges import EdgeStore
from bigembed.train.single_machine import train
from support.graphs import graph_config, write_graph


def reference_ranks(cfg, all_negs: bool) -> np.ndarray:
    """Every ranked side's rank (lhs and rhs), by the documented rule, in plain torch."""
    model = load_trained(cfg.checkpoint_path)
    state = model.model.state_dict()
    diag = state["rhs_operators.0.diagonal"]  # standard mode: op acts on the rhs side
    emb = {
        p: model.embeddings("node", p).clone() for p in range(cfg.entities["node"].num_partitions)
    }
    store = EdgeStore(cfg.edge_paths[0])
    chunk = cfg.num_batch_negs
    batch = -(-cfg.batch_size // chunk) * chunk
    ranks = []
    for i, j in sorted(store.buckets()):
        if store.num_edges(i, j) == 0:
            continue
        edges = store.load_bucket(i, j)
        lhs_all, rhs_all = emb[i], emb[j]
        heads = torch.from_numpy(edges.lhs.astype(np.int64))
        tails = torch.from_numpy(edges.rhs.astype(np.int64))
        for b0 in range(0, len(heads), batch):
            bh, bt = heads[b0 : b0 + batch], tails[b0 : b0 + batch]
            size = min(chunk, len(bh))
            for e in range(len(bh)):
                h, t = lhs_all[bh[e]], rhs_all[bt[e]] * diag
                pos = float(h @ t)
                if all_negs:
                    head_negs = [k for k in range(lhs_all.shape[0]) if k != bh[e]]
                    tail_negs = [k for k in range(rhs_all.shape[0]) if k != bt[e]]
                    head_scores = [float(lhs_all[k] @ t) for k in head_negs]
                    tail_scores = [float(h @ (rhs_all[k] * diag)) for k in tail_negs]
                else:
                    c0 = e - e % size
                    others = [k for k in range(c0, min(c0 + size, len(bh))) if k != e]
                    head_scores = [float(lhs_all[bh[k]] @ t) for k in others]
                    tail_scores = [float(h @ (rhs_all[bt[k]] * diag)) for k in others]
                for scores in (head_scores, tail_scores):
                    ranks.append(1 + sum(s >= pos for s in scores))
    return np.array(ranks)


@pytest.mark.parametrize("all_negs", [False, True])
def test_sampled_protocol_matches_reference(tmp_path: Path, all_negs: bool) -> None:
    write_graph(
        tmp_path, num_entities=120, num_edges=700, num_partitions=2, num_relations=1, seed=5
    )
    cfg = graph_config(
        tmp_path,
        num_partitions=2,
        num_epochs=3,
        seed=3,
        dynamic_relations=False,
        relations=[
            {
                "name": "r0",
                "lhs": "node",
                "rhs": "node",
                "operator": "diagonal",
                "all_negs": all_negs,
            }
        ],
        num_batch_negs=7,
        num_uniform_negs=0,
        batch_size=30,
    )
    train(cfg, progress=False)
    out = tmp_path / "report.json"
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text((Path(cfg.checkpoint_path) / "config.json").read_text())
    code = cli_main(
        [
            "eval",
            str(cfg_path),
            "--edges",
            cfg.edge_paths[0],
            "--protocol",
            "sampled",
            "--output",
            str(out),
        ]
    )
    assert code in (0, None)
    got = json.loads(out.read_text())["overall"]["raw"]

    ranks = reference_ranks(cfg, all_negs)
    assert got["count"] == len(ranks) == 2 * 700
    assert len(np.unique(ranks)) > 3, "a trained model ranks edges differently"
    want = {"mrr": float(np.mean(1 / ranks)), "mr": float(np.mean(ranks))}
    want.update({f"hits@{k}": float(np.mean(ranks <= k)) for k in (1, 3, 10, 50)})
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-9), (key, got[key], value)
