"""The evaluation report: metrics as a table and as JSON, built from per-edge ranks.

:func:`build_report` turns the ranks of every evaluated edge (from one machine, or merged from
several ranks) into an :class:`EvalReport`; :func:`~bigembed.eval.evaluation.evaluate_checkpoint`
is what ``bigembed eval`` and ``bigembed demo`` call.
"""

from __future__ import annotations

import json
import os
from dataclasses import field
from typing import Any

import numpy as np
from pydantic import Field, field_serializer
from pydantic.dataclasses import dataclass

from bigembed.atomic import atomic_write_text
from bigembed.checkpoints import TrainedModel
from bigembed.eval.edge_input import LoadedEdges
from bigembed.ranking import SIDES, KnownEdges, RankingResult, summarize, summarize_groups
from bigembed.serialization import RECORD_CONFIG, JsonForm, omit_none


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


# ---------------------------------------------------------------------- building


def build_report(
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
    """The report on ``ranking`` (both sides of every evaluated edge, in input order)."""
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
