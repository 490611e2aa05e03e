"""The candidates a prediction never answers: known true edges (``filtered``) and, on a
relation within one entity type, the query entity itself."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bigembed.checkpoints import TrainedModel
from bigembed.ranking import KnownEdges

#: (query rows, global candidate ids) that never count, as the search takes them.
Exclusions = tuple[np.ndarray, np.ndarray]


def exclusions(
    known: KnownEdges | None,
    given: np.ndarray,
    rel_ids: np.ndarray,
    side: str,
    leave_out_self: bool,
) -> Exclusions | None:
    """What the queries ``given`` (global ids of the known side) under ``rel_ids`` must not
    answer: the known true completions when ``known`` is given, the query entity itself when
    ``leave_out_self`` (the caller says so only when both sides have the same type)."""
    exclude: Exclusions | None = None
    if known is not None:
        exclude = (
            known.true_tails(given, rel_ids) if side == "rhs" else known.true_heads(given, rel_ids)
        )
    if leave_out_self:
        own_rows, own_ids = np.arange(len(given)), np.asarray(given, np.int64)
        if exclude is not None:
            own_rows = np.concatenate([exclude[0], own_rows])
            own_ids = np.concatenate([exclude[1], own_ids])
        exclude = (own_rows, own_ids)
    return exclude


def known_edges(
    trained: TrainedModel,
    entity_path: Path,
    filtered: bool | Sequence[str | os.PathLike[str]] | None,
    cache: dict[tuple[str, ...], KnownEdges],
) -> KnownEdges | None:
    """The known true edges of ``filtered`` (True: the config's edge paths; or edge paths /
    edge files; False or None: none), read once per set of paths into ``cache``."""
    if filtered is False or filtered is None:
        return None
    paths = (
        tuple(trained.config.edge_paths) if filtered is True else tuple(str(p) for p in filtered)
    )
    if paths not in cache:
        from bigembed.eval import EdgeLoader
        from bigembed.ranking import EvalEdges

        loader = EdgeLoader(trained, entity_path=entity_path)
        edges = EvalEdges.concat([loader.load(p).edges for p in paths])
        cache[paths] = KnownEdges(edges.lhs, edges.rel, edges.rhs, trained.model.num_relations)
    return cache[paths]
