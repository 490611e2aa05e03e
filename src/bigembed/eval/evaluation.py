"""One evaluation's inputs, its ranking (of all edges or of a share of them), its report.

:func:`prepare_evaluation` opens the checkpoint, loads the edges to evaluate and the known edges
to filter with; :meth:`Evaluation.rank` ranks them (or the edges a distributed rank was given);
:meth:`Evaluation.report` turns per-edge ranks into the :class:`~bigembed.eval.report.EvalReport`.
``bigembed eval`` on one machine runs the three in a row
(:func:`evaluate_checkpoint`); on several ranks every rank prepares the
same inputs, ranks its share and rank 0 reports on the merged ranks
(:mod:`bigembed.eval.shares`), so both paths build the report with the same code.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bigembed.checkpoints import EntityTables, TrainedModel, load_trained
from bigembed.config import ConfigSchema
from bigembed.errors import InputError
from bigembed.eval.edge_input import EdgeLoader, FileOptions, LoadedEdges
from bigembed.eval.report import EvalReport, build_report
from bigembed.model import choose_compute_dtype
from bigembed.ranking import EvalEdges, KnownEdges, RankingResult, rank_edges

logger = logging.getLogger(__name__)

PROTOCOLS = ("full", "sampled")
_MODEL_KEYS = (
    "entities",
    "relations",
    "dimension",
    "comparator",
    "bias",
    "global_emb",
    "dynamic_relations",
)


@dataclass
class Evaluation:
    """What an evaluation reads, once loaded: the model, the edges, the filters."""

    cfg: ConfigSchema
    trained: TrainedModel
    protocol: str
    per_relation: bool
    loader: EdgeLoader
    sources: list[LoadedEdges]
    edges: EvalEdges
    known: KnownEdges | None
    filter_names: list[str]
    notes: list[str]
    tables: EntityTables
    chunk_size: int = 1024
    started: float = field(default_factory=time.perf_counter)
    sampled_negatives: float = 0.0  # the sampled protocol's mean negatives, once ranked

    def rank(
        self, rows: np.ndarray | None = None, *, progress: bool = False
    ) -> tuple[RankingResult, float | None]:
        """Ranks of the edges ``rows`` (indices into :attr:`edges`; all edges by default), in
        that order, and the sampled protocol's loss sum (None for full ranking)."""
        edges = self.edges if rows is None else _subset(self.edges, rows)
        bar = tqdm(
            total=len(edges),
            desc="eval",
            unit="edge",
            unit_scale=True,
            disable=not progress,
            dynamic_ncols=True,
            leave=False,
        )
        try:
            if self.protocol == "full":
                ranking = rank_edges(
                    self.trained.model,
                    self.tables,
                    self.trained.partition_bases,
                    edges,
                    self.known,
                    chunk_size=self.chunk_size,
                    progress=bar.update,
                )
                return ranking, None
            from bigembed.buckets import negative_settings
            from bigembed.eval.sampled import sampled_ranks

            result = sampled_ranks(
                self.trained.model,
                self.tables,
                edges,
                # PBG's sampled protocol: no query-entity column (self_negative is training's).
                replace(negative_settings(self.cfg), self_negative=False),
                self.cfg.batch_size,
                self.cfg.seed,
                progress=bar.update,
            )
            self.sampled_negatives = result.num_negatives
            return result.ranking, result.loss_sum
        finally:
            bar.close()

    def candidates(self) -> str:
        """What each edge was ranked against, for the report."""
        if self.protocol == "full":
            types = {t for r in self.trained.config.relations for t in (r.lhs, r.rhs)}
            return (
                "all entities of the corrupted side's type, across all partitions ("
                + ", ".join(f"{t}: {self.tables.total(t):,}" for t in sorted(types))
                + ")"
            )
        from bigembed.buckets import negative_settings

        negs = negative_settings(self.cfg)
        return (
            f"sampled from the edge's partitions: "
            f"num_batch_negs={negs.num_batch_negs}, "
            f"num_uniform_negs={negs.num_uniform_negs} (all_negs per relation); "
            f"{self.sampled_negatives:,.1f} negatives per positive on average"
        )

    def report(self, ranking: RankingResult, loss_sum: float | None = None) -> EvalReport:
        """The report on ``ranking`` (the ranks of all :attr:`edges`, in their order)."""
        report = build_report(
            self.trained,
            ranking,
            self.protocol,
            self.sources,
            self.filter_names,
            self.known,
            self.per_relation,
            self.candidates(),
            self.notes,
            None if loss_sum is None else loss_sum / max(len(self.edges), 1),
        )
        report.seconds = time.perf_counter() - self.started
        return report


def evaluate_checkpoint(
    cfg_or_dir: ConfigSchema | str | os.PathLike[str],
    edge_paths: Sequence[str | os.PathLike[str]] | None = None,
    filter_paths: Sequence[str | os.PathLike[str]] | None = None,
    *,
    filtered: bool = True,
    per_relation: bool = False,
    protocol: str = "full",
    entity_path: str | os.PathLike[str] | None = None,
    file_options: FileOptions | None = None,
    chunk_size: int = 1024,
    progress: bool = False,
    cache_bytes: int = 2 << 30,
    exclude_self: bool = False,
) -> EvalReport:
    """Evaluate the last checkpoint of a config (or a checkpoint directory) on edge sets.

    ``edge_paths``: imported edge paths or files of names (default: the config's
    ``edge_paths``). ``filter_paths``: the known true edges to filter with (default: the
    config's ``edge_paths``); the evaluated edges are always added to them. With a directory
    instead of a config, the config stored in the checkpoint is used.
    ``exclude_self``: in the filtered metrics, the query's own entity is not a candidate
    answer (for relations between entities of one type: "who will X follow" never answers X).

    Example::

        report = evaluate_checkpoint(load_config("fb15k237.yaml"), ["data/test.txt"])
        print(report.table())
        print(report.headline["mrr"])
    """
    evaluation = prepare_evaluation(
        cfg_or_dir,
        edge_paths,
        filter_paths,
        filtered=filtered,
        per_relation=per_relation,
        protocol=protocol,
        entity_path=entity_path,
        file_options=file_options,
        chunk_size=chunk_size,
        cache_bytes=cache_bytes,
        exclude_self=exclude_self,
    )
    ranking, loss_sum = evaluation.rank(progress=progress)
    return evaluation.report(ranking, loss_sum)


def prepare_evaluation(
    cfg_or_dir: ConfigSchema | str | os.PathLike[str],
    edge_paths: Sequence[str | os.PathLike[str]] | None = None,
    filter_paths: Sequence[str | os.PathLike[str]] | None = None,
    *,
    filtered: bool = True,
    per_relation: bool = False,
    protocol: str = "full",
    entity_path: str | os.PathLike[str] | None = None,
    file_options: FileOptions | None = None,
    chunk_size: int = 1024,
    cache_bytes: int = 2 << 30,
    exclude_self: bool = False,
) -> Evaluation:
    """Check the options, open the checkpoint, load the edges and the filters (the arguments
    are :func:`evaluate_checkpoint`'s)."""
    if protocol not in PROTOCOLS:
        known_protocols = ", ".join(PROTOCOLS)
        raise InputError(f"unknown evaluation protocol {protocol!r} (known: {known_protocols})")
    if exclude_self and not (filtered and protocol == "full"):
        raise InputError(
            "--exclude-self leaves the query entity out of the filtered ranking: it needs the "
            "full protocol's filtered metrics (drop --raw-only / --protocol sampled)"
        )
    started = time.perf_counter()
    if isinstance(cfg_or_dir, ConfigSchema):
        cfg = cfg_or_dir
        trained = load_trained(cfg.checkpoint_path)
        _warn_if_model_differs(cfg, trained)
        # how to compute, not what was learnt: the given config's choice (`-p compute_dtype=`)
        if cfg.compute_dtype != trained.config.compute_dtype:
            trained.model.use_dtype(choose_compute_dtype(cfg.compute_dtype))
            logger.info(trained.model.dtype_choice.line())
        if entity_path is None:
            entity_path = cfg.entity_path
    else:
        trained = load_trained(cfg_or_dir)
        cfg = trained.config
    loader = EdgeLoader(trained, entity_path=entity_path, options=file_options)
    sources = [loader.load(p) for p in (edge_paths if edge_paths else cfg.edge_paths)]
    edges = EvalEdges.concat([s.edges for s in sources])
    if len(edges) == 0:
        raise InputError("no edges to evaluate in " + ", ".join(s.path for s in sources))
    notes = [
        f"{s.path}: {s.skipped:,} edge(s) with unknown names skipped, e.g. "
        + "; ".join(s.skipped_examples)
        for s in sources
        if s.skipped
    ]
    known = None
    filter_names: list[str] = []
    if filtered and protocol == "full":
        chosen = filter_paths if filter_paths is not None else cfg.edge_paths
        known, filter_names = _known_edges(loader, trained, sources, chosen, exclude_self)
        if exclude_self:
            notes.append("the query entity is not a candidate for itself (--exclude-self)")
    elif filtered:
        notes.append("the sampled protocol reports raw ranks only (as PBG does)")
    return Evaluation(
        cfg=cfg,
        trained=trained,
        protocol=protocol,
        per_relation=per_relation,
        loader=loader,
        sources=sources,
        edges=edges,
        known=known,
        filter_names=filter_names,
        notes=notes,
        tables=EntityTables(trained, max_bytes=cache_bytes),
        chunk_size=chunk_size,
        started=started,
    )


def _subset(edges: EvalEdges, rows: np.ndarray) -> EvalEdges:
    return EvalEdges(edges.lhs[rows], edges.rel[rows], edges.rhs[rows])


def _warn_if_model_differs(cfg: ConfigSchema, trained: TrainedModel) -> None:
    ours, theirs = cfg.model_dump(mode="json"), trained.config.model_dump(mode="json")
    differ = [k for k in _MODEL_KEYS if ours.get(k) != theirs.get(k)]
    if differ:
        logger.warning(
            "the config differs from the one %s was trained with in %s; the checkpoint's "
            "settings are used for the model",
            trained.path,
            ", ".join(differ),
        )


def _known_edges(
    loader: EdgeLoader,
    trained: TrainedModel,
    sources: list[LoadedEdges],
    filter_paths: Sequence[str | os.PathLike[str]],
    exclude_self: bool = False,
) -> tuple[KnownEdges, list[str]]:
    """The known true edges: the filter sets plus the evaluated edges, each path read once;
    with ``exclude_self`` also (h, r, h) and (t, r, t) for each evaluated edge (h, r, t) of a
    relation between one entity type, so that neither query is answered by itself."""
    seen = {os.path.realpath(s.path): s for s in sources}
    parts = [s.edges for s in sources]
    names = [s.path for s in sources]
    for path in filter_paths:
        real = os.path.realpath(path)
        if real in seen:
            continue
        if not Path(path).exists():
            raise InputError(
                f"{path}: filter edge set not found (filtering uses the config's edge_paths by "
                f"default); pass --filter-edges PATH ... or --raw-only"
            )
        loaded = loader.load(path)
        seen[real] = loaded
        parts.append(loaded.edges)
        names.append(loaded.path)
    if exclude_self:
        evaluated = EvalEdges.concat([s.edges for s in sources])
        one_type = np.array(loader.lhs_types) == np.array(loader.rhs_types)
        keep = one_type[evaluated.rel]
        rel = evaluated.rel[keep]
        for node in (evaluated.lhs[keep], evaluated.rhs[keep]):
            parts.append(EvalEdges(lhs=node, rel=rel, rhs=node))
    all_edges = EvalEdges.concat(parts)
    known = KnownEdges(all_edges.lhs, all_edges.rel, all_edges.rhs, trained.model.num_relations)
    return known, names
