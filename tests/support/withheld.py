"""The quality of a trained tiny graph, measured the same way for every way of training it."""

from __future__ import annotations

from typing import Any

import numpy as np


def withheld_mrr(cfg: Any) -> float:
    """Raw MRR of the edges training withheld (eval_fraction), ranked against all entities."""
    from bigembed.checkpoints.reading import load_trained
    from bigembed.ranking.full import EvalEdges, rank_edges
    from bigembed.storage.edges import EdgeStore
    from bigembed.train.evaluation import split_eval
    from bigembed.train.loop import _mix

    model = load_trained(cfg.checkpoint_path)
    edges = EdgeStore(cfg.edge_paths[0])
    base = model.partition_bases["node"]
    heads, rels, tails = [], [], []
    for i, j in edges.buckets():
        n = edges.num_edges(i, j)
        if n == 0:
            continue
        chunk = edges.load_chunk(i, j, 0, 1)
        idx = split_eval(n, cfg.eval_fraction, _mix(cfg.seed, 2, 0, 0, i, j))[0].numpy()
        heads.append(chunk.lhs[idx] + base[i])
        tails.append(chunk.rhs[idx] + base[j])
        rels.append(chunk.rel[idx])
    test = EvalEdges(np.concatenate(heads), np.concatenate(rels), np.concatenate(tails))
    result = rank_edges(model.model, model.embeddings, model.partition_bases, test, None)
    assert result.lhs is not None and result.rhs is not None, "both sides are ranked"
    ranks = np.concatenate([result.lhs.raw, result.rhs.raw])
    return float((1.0 / ranks).mean())
