"""Edges to evaluate or filter with, in global entity ids: from an imported edge path or a file.

An *edge path* (a directory written by ``bigembed import``) holds partition offsets; they
become global ids with the checkpoint's partition bases. A raw *file* (TSV/CSV/Parquet of
names, optionally compressed) is mapped through the entity store's names: an unknown entity
or relation name is an error naming the file and line, unless ``skip_unknown`` asks to leave
such edges out and count them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bigembed.checkpoints import TrainedModel, open_entity_store
from bigembed.config import relation_list
from bigembed.edgelists import ColumnSpec, EdgeNameFile, NameBatch, NameFileOptions, TextOptions
from bigembed.errors import InputError
from bigembed.ranking import EvalEdges
from bigembed.storage import (
    MANIFEST,
    EdgeStore,
    EntityStore,
    check_edges_relations,
    has_manifest,
)


@dataclass
class LoadedEdges:
    """The edges of one input, and how many of its rows were left out (``skip_unknown``)."""

    path: str
    kind: str  # "edge path" or "file"
    edges: EvalEdges
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kind": self.kind,
            "edges": len(self.edges),
            "skipped": self.skipped,
        }


@dataclass
class FileOptions:
    """How raw edge files are read (the columns default to ``lhs rel rhs``)."""

    columns: ColumnSpec = field(default_factory=ColumnSpec)
    text: TextOptions = field(default_factory=TextOptions)
    format: str | None = None  # None: from the file name
    skip_unknown: bool = False


class EdgeLoader:
    """Loads edge inputs for one trained model (its relations, types and partition bases)."""

    def __init__(
        self,
        trained: TrainedModel,
        *,
        entity_path: str | os.PathLike[str] | None = None,
        options: FileOptions | None = None,
    ) -> None:
        self.trained = trained
        self.entity_path = entity_path
        self.options = options or FileOptions()
        cfg = trained.config
        self.relation_names = trained.relation_names
        if cfg.dynamic_relations:
            rel = cfg.relations[0]
            self.lhs_types = [rel.lhs] * len(self.relation_names)
            self.rhs_types = [rel.rhs] * len(self.relation_names)
        else:
            self.lhs_types = [r.lhs for r in cfg.relations]
            self.rhs_types = [r.rhs for r in cfg.relations]
        self._store: EntityStore | None = None

    @property
    def entity_store(self) -> EntityStore:
        if self._store is None:
            self._store = open_entity_store(self.trained, self.entity_path)
        return self._store

    def load(self, path: str | os.PathLike[str]) -> LoadedEdges:
        p = Path(path)
        if p.is_dir():
            if not has_manifest(p):
                raise InputError(
                    f"{p}: not an imported edge path (no {MANIFEST}); pass a directory written "
                    f"by `bigembed import` or an edge file (.tsv/.csv/.parquet)"
                )
            names = Path(self.entity_path or self.trained.config.entity_path)
            if has_manifest(names):
                _ = self.entity_store  # the edges' ids mean the import the model was trained on
            store = EdgeStore(p, entities=self.entity_store)
            return LoadedEdges(str(p), "edge path", self._from_store(store))
        if not p.exists():
            raise InputError(f"{p}: no such edge path or edge file")
        return self._from_file(p)

    # ------------------------------------------------------------------ imported edge paths
    def _from_store(self, store: EdgeStore) -> EvalEdges:
        check_edges_relations(relation_list(self.trained.config), store)
        bases = self.trained.partition_bases
        num_rel = len(self.relation_names)
        parts_of = {t: self.trained.num_partitions(t) for t in self.trained.config.entities}
        lhs_types = np.array(self.lhs_types)
        rhs_types = np.array(self.rhs_types)
        out: list[EvalEdges] = []
        for i, j in store.buckets():
            if store.num_edges(i, j) == 0:
                continue
            chunk = store.load_bucket(i, j)
            rel = chunk.rel.astype(np.int64)
            if rel.min() < 0 or rel.max() >= num_rel:
                raise InputError(
                    f"{store.path}: bucket ({i}, {j}) has relation id {int(rel.max())} but the "
                    f"model knows {num_rel} relation(s) (was it imported for another config?)"
                )
            lhs = np.empty(len(rel), np.int64)
            rhs = np.empty(len(rel), np.int64)
            for side, offsets, types, part_idx, dest in (
                ("lhs", chunk.lhs, lhs_types, i, lhs),
                ("rhs", chunk.rhs, rhs_types, j, rhs),
            ):
                for etype in np.unique(types[rel]).tolist():
                    sel = np.flatnonzero(types[rel] == etype)
                    part = part_idx if parts_of[etype] > 1 else 0
                    if part >= parts_of[etype]:
                        raise InputError(
                            f"{store.path}: bucket ({i}, {j}) does not fit entity type {etype!r} "
                            f"with {parts_of[etype]} partition(s)"
                        )
                    off = offsets[sel].astype(np.int64)
                    count = int(bases[etype][part + 1] - bases[etype][part])
                    if len(off) and (off.min() < 0 or off.max() >= count):
                        raise InputError(
                            f"{store.path}: bucket ({i}, {j}) has {side} offset {int(off.max())} "
                            f"but {etype!r} partition {part} has {count} entities in the "
                            f"checkpoint (was the graph re-imported?)"
                        )
                    dest[sel] = off + bases[etype][part]
            out.append(EvalEdges(lhs, rel, rhs))
        return EvalEdges.concat(out)

    # ------------------------------------------------------------------ raw files of names
    def _from_file(self, path: Path) -> LoadedEdges:
        opts = self.options
        source = EdgeNameFile(path, NameFileOptions(opts.columns, opts.text, opts.format))
        if opts.columns.rel is None and len(self.relation_names) > 1:
            raise InputError(
                f"{path}: no relation column (--rel-col none) but the model has "
                f"{len(self.relation_names)} relations; give --rel-col"
            )
        loaded = LoadedEdges(str(path), "file", EvalEdges(np.empty(0), np.empty(0), np.empty(0)))
        rel_values = pa.array(self.relation_names, pa.string())
        parts = [self._map_batch(source, batch, rel_values, loaded) for batch in source.batches()]
        loaded.edges = EvalEdges.concat(parts)
        return loaded

    def _map_batch(
        self,
        source: EdgeNameFile,
        batch: NameBatch,
        rel_values: pa.Array,
        loaded: LoadedEdges,
    ) -> EvalEdges:
        cols = batch.columns
        n = batch.num_rows
        if "rel" in cols:
            rel_names = cols["rel"]
            rel = pc.fill_null(pc.index_in(rel_names, value_set=rel_values), -1)
            rel = rel.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            rel_names = None
            rel = np.zeros(n, np.int64)
        lhs = np.full(n, -1, np.int64)
        rhs = np.full(n, -1, np.int64)
        names = {"lhs": cols["lhs"], "rhs": cols["rhs"]}
        types = {"lhs": np.array(self.lhs_types), "rhs": np.array(self.rhs_types)}
        known_rel = rel >= 0
        for side, dest in (("lhs", lhs), ("rhs", rhs)):
            side_types = np.where(known_rel, types[side][np.maximum(rel, 0)], "")
            for etype in np.unique(side_types[known_rel]).tolist():
                sel = np.flatnonzero(side_types == etype)
                parts, offsets = self.entity_store.lookup(etype, names[side].take(pa.array(sel)))
                bases = self.trained.partition_bases[etype]
                found = parts >= 0
                dest[sel[found]] = bases[parts[found]] + offsets[found]
        bad = (rel < 0) | (lhs < 0) | (rhs < 0)
        if bad.any():
            rows = np.flatnonzero(bad)
            if not self.options.skip_unknown:
                row = int(rows[0])
                raise InputError(
                    f"{source.where(batch.first_row + row)}: "
                    f"{self._why(row, rel, lhs, rhs, rel_names, names)}; "
                    f"use --skip-unknown to leave such edges out"
                )
            loaded.skipped += len(rows)
            for row in rows[: max(0, 3 - len(loaded.skipped_examples))]:
                loaded.skipped_examples.append(self._why(int(row), rel, lhs, rhs, rel_names, names))
            keep = ~bad
            return EvalEdges(lhs[keep], rel[keep], rhs[keep])
        return EvalEdges(lhs, rel, rhs)

    def _why(
        self,
        row: int,
        rel: np.ndarray,
        lhs: np.ndarray,
        rhs: np.ndarray,
        rel_names: pa.Array | None,
        names: dict[str, pa.Array],
    ) -> str:
        if rel[row] < 0:
            assert rel_names is not None
            return f"unknown relation {rel_names[row].as_py()!r} (not one of the model's relations)"
        for side, ids, types in (("lhs", lhs, self.lhs_types), ("rhs", rhs, self.rhs_types)):
            if ids[row] < 0:
                etype = types[int(rel[row])]
                return (
                    f"unknown {side} entity {names[side][row].as_py()!r} (not in the "
                    f"{etype!r} names of {self.entity_store.path})"
                )
        return "bad edge"
