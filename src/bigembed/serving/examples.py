"""A few example predictions as text for people to read (``bigembed demo``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigembed.ranking import direction
from bigembed.serving.ids import ids_to_names
from bigembed.serving.model import EmbeddingModel


def example_predictions(
    model: EmbeddingModel,
    n: int = 5,
    *,
    edge_path: str | Path | None = None,
    k: int = 3,
    seed: int = 0,
) -> str:
    """A few example tail predictions with names, as text for people to read.

    Draws ``n`` edges from ``edge_path`` (an edge path or edge file; default: the config's
    first edge path), shows the top ``k`` tails of each ``(lhs, rel, ?)``, marks the true tail
    with ``*`` and gives its raw rank among all entities of its type.
    """
    from bigembed.eval import EdgeLoader
    from bigembed.ranking import EvalEdges, rank_edges

    path = edge_path if edge_path is not None else model.config.edge_paths[0]
    edges = EdgeLoader(model.trained, entity_path=model.store.path).load(path).edges
    if len(edges) == 0:
        return f"(no edges in {path})"
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(edges), min(n, len(edges)), replace=False))
    sample = EvalEdges(edges.lhs[pick], edges.rel[pick], edges.rhs[pick])
    ranks = rank_edges(model.model, model.tables, model.trained.partition_bases, sample, None).rhs
    assert ranks is not None
    lines = [f"Example predictions from {path} (top {k} tails; * marks the true tail):"]
    for i in range(len(sample)):
        rid = int(sample.rel[i])
        d = direction(model.model, "rhs", rid)
        head = ids_to_names(model.store, model.tables, d.source_type, sample.lhs[i : i + 1])[0]
        tail = ids_to_names(model.store, model.tables, d.target_type, sample.rhs[i : i + 1])[0]
        rel = model.relation_names[rid]
        lines.append(f"  {head}  --{rel}-->  ?")
        for j, p in enumerate(model.predict(head, rid, k=k), start=1):
            mark = " *" if p.name == tail else ""
            lines.append(f"      {j}. {p.name}  ({p.score:.3f}){mark}")
        lines.append(
            f"      true tail {tail}: rank {int(ranks.raw[i]):,} of {int(ranks.candidates[i]):,}"
        )
    return "\n".join(lines)
