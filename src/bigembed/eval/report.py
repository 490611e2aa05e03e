"""Evaluate a checkpoint on edge sets and report the metrics as a table and as JSON.

:func:`evaluate_checkpoint` is what ``bigembed eval`` and ``bigembed demo`` call: it opens the
checkpoint once, loads the edges to evaluate (imported edge paths or files of names) and the
known edges to filter with, ranks, and returns an :class:`EvalReport`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_serializer
from pydantic.dataclasses import dataclass
from tqdm import tqdm

from bigembed.atomic import atomic_write_text
from bigembed.checkpoints import EntityTables, TrainedModel, load_trained
from bigembed.config import ConfigSchema
from bigembed.errors import InputError
from bigembed.eval.edge_input import EdgeLoader, FileOptions, LoadedEdges
from bigembed.ranking import (
    SIDES,
    EvalEdges,
    KnownEdges,
    RankingResult,
    rank_edges,
    summarize,
    summarize_groups,
)
from bigembed.serialization import RECORD_CONFIG, JsonForm, omit_none

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


@dataclass(kw_only=True, config=RECORD_CONFIG)
class EvalReport(JsonForm):
    """Metrics of one evaluation; ``table()`` for people, ``to_json()`` for programs.

    The fields are in the order of the JSON form's keys (aliases: the keys that differ).
    """

    protocol: str
    checkpoint: str
    version: int
    inputs: list[dict[str, Any]] = Field(serialization_alias="edges")
    num_edges: int
    filtered: bool
    filter_inputs: list[str] = Field(serialization_alias="filter_edges")
    num_known: int = Field(serialization_alias="num_known_edges")
    candidates: str
    ties: str = "count against the true entity"
    overall: dict[str, dict[str, Any] | None]
    sides: dict[str, dict[str, dict[str, Any] | None]]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    loss: float | None = omit_none()
    per_relation: list[dict[str, Any]] | None = omit_none()

    @field_serializer("seconds")
    def _rounded(self, value: float) -> float:
        return round(value, 3)

    def json_text(self, indent: int | None = 1) -> str:
        """:meth:`to_json` as the text ``bigembed eval --json`` writes."""
        return json.dumps(self.to_json(), indent=indent) + "\n"

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`json_text` to ``path`` atomically (never a half-written report)."""
        atomic_write_text(path, self.json_text())

    @property
    def headline(self) -> dict[str, float] | None:
        """Filtered metrics when there are any, else raw."""
        return self.overall.get("filtered") or self.overall.get("raw")

    def table(self) -> str:
        name = "full ranking" if self.protocol == "full" else "sampled negatives (PBG-style)"
        lines = [
            f"Evaluation of {self.checkpoint} (version {self.version}) - protocol: {name}",
            f"  candidates: {self.candidates}",
            f"  edges: {self.num_edges:,} from "
            + ", ".join(
                f"{i['path']}" + (f" ({i['skipped']:,} skipped)" if i["skipped"] else "")
                for i in self.inputs
            ),
        ]
        if self.filtered:
            lines.append(
                f"  filtered against {self.num_known:,} known edges from "
                + ", ".join(self.filter_inputs)
            )
        lines.append("  ties count against the true entity; each edge is ranked on both sides")
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.append("")
        head = (
            f"{'':<14}{'ranks':>9}{'MRR':>9}{'MR':>10}{'Hits@1':>9}{'Hits@3':>9}"
            f"{'Hits@10':>9}{'Hits@50':>9}{'AUC':>8}"
        )
        lines.append(head)
        for label, kind in (("raw", "raw"), ("filtered", "filtered")):
            m = self.overall.get(kind)
            if m is not None:
                lines.append(_metric_row(label, m))
        for side in SIDES:
            for kind in ("raw", "filtered"):
                m = (self.sides.get(side) or {}).get(kind)
                if m is not None and (kind == "filtered" or not self.filtered):
                    label = f"{'head' if side == 'lhs' else 'tail'} {kind[:4]}"
                    lines.append(_metric_row(label, m))
        if self.loss is not None:
            lines.append(f"  loss per edge: {self.loss:.4f}")
        if self.per_relation is not None:
            kind = "filtered" if self.filtered else "raw"
            lines.append("")
            lines.append(f"Per relation ({kind}; MRR(raw) for comparison)")
            lines.append(
                f"{'relation':<44}{'ranks':>8}{'MRR':>8}{'MRR(raw)':>9}{'MR':>10}"
                f"{'Hits@1':>8}{'Hits@10':>8}{'AUC':>7}"
            )
            for row in self.per_relation:
                m, raw = row[kind], row["raw"]
                rname = row["relation"]
                if len(rname) > 43:
                    rname = "…" + rname[-42:]
                lines.append(
                    f"{rname:<44}{m['count']:>8}{m['mrr']:>8.4f}{raw['mrr']:>9.4f}"
                    f"{m['mr']:>10.1f}{m['hits@1']:>8.4f}{m['hits@10']:>8.4f}"
                    f"{m['auc']:>7.3f}"
                )
        lines.append("")
        lines.append(f"({self.seconds:.1f}s)")
        return "\n".join(lines)


def _metric_row(label: str, m: dict[str, float]) -> str:
    return (
        f"{label:<14}{m['count']:>9}{m['mrr']:>9.4f}{m['mr']:>10.2f}{m['hits@1']:>9.4f}"
        f"{m['hits@3']:>9.4f}{m['hits@10']:>9.4f}{m['hits@50']:>9.4f}{m['auc']:>8.4f}"
    )


# ---------------------------------------------------------------------- evaluation


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

    tables = EntityTables(trained, max_bytes=cache_bytes)
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
        if protocol == "full":
            ranking = rank_edges(
                trained.model,
                tables,
                trained.partition_bases,
                edges,
                known,
                chunk_size=chunk_size,
                progress=bar.update,
            )
            loss = None
            types = {t for r in trained.config.relations for t in (r.lhs, r.rhs)}
            candidates = (
                "all entities of the corrupted side's type, across all partitions ("
                + ", ".join(f"{t}: {tables.total(t):,}" for t in sorted(types))
                + ")"
            )
        else:
            from bigembed.buckets import negative_settings
            from bigembed.eval.sampled import sampled_ranks

            negs = negative_settings(cfg)
            result = sampled_ranks(
                trained.model, tables, edges, negs, cfg.batch_size, cfg.seed, progress=bar.update
            )
            ranking = result.ranking
            loss = result.loss_sum / max(len(edges), 1)
            candidates = (
                f"sampled from the edge's partitions: "
                f"num_batch_negs={negs.num_batch_negs}, "
                f"num_uniform_negs={negs.num_uniform_negs} (all_negs per relation); "
                f"{result.num_negatives:,.1f} negatives per positive on average"
            )
    finally:
        bar.close()
    report = _build_report(
        trained,
        ranking,
        protocol,
        sources,
        filter_names,
        known,
        per_relation,
        candidates,
        notes,
        loss,
    )
    report.seconds = time.perf_counter() - started
    return report


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


def _build_report(
    trained: TrainedModel,
    ranking: RankingResult,
    protocol: str,
    sources: list[LoadedEdges],
    filter_names: list[str],
    known: KnownEdges | None,
    per_relation: bool,
    candidates: str,
    notes: list[str],
    loss: float | None,
) -> EvalReport:
    kinds = ["raw"] + (["filtered"] if known is not None else [])
    present = [s for s in SIDES if ranking.side(s) is not None]

    def stacked(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ranks, aucs, rels = [], [], []
        for s in present:
            side = ranking.side(s)
            assert side is not None
            ranks.append(side.ranks(kind == "filtered"))
            aucs.append(side.auc(kind == "filtered"))
            rels.append(ranking.rel)
        return np.concatenate(ranks), np.concatenate(aucs), np.concatenate(rels)

    overall: dict[str, dict[str, float] | None] = {"raw": None, "filtered": None}
    sides: dict[str, dict[str, dict[str, float] | None]] = {}
    for s in present:
        side = ranking.side(s)
        assert side is not None
        sides[s] = {
            k: summarize(side.ranks(k == "filtered"), side.auc(k == "filtered")) for k in kinds
        }
    rows: list[dict[str, Any]] | None = None
    names = trained.relation_names
    if per_relation:
        rows = [{"relation": n, "id": i} for i, n in enumerate(names)]
    for kind in kinds:
        ranks, aucs, rels = stacked(kind)
        overall[kind] = summarize(ranks, aucs)
        if rows is not None:
            for row, m in zip(rows, summarize_groups(ranks, aucs, rels, len(names)), strict=True):
                row[kind] = m
    if rows is not None:
        rows = [r for r in rows if r["raw"]["count"] > 0]
        for r in rows:
            r.setdefault("filtered", None)
    return EvalReport(
        protocol=protocol,
        checkpoint=str(trained.path),
        version=trained.version,
        inputs=[s.describe() for s in sources],
        filter_inputs=filter_names,
        num_edges=len(ranking.rel),
        num_known=(known.num_edges if known is not None else 0),
        filtered=known is not None,
        candidates=candidates,
        overall=overall,
        sides=sides,
        per_relation=rows,
        notes=notes,
        loss=loss,
    )
