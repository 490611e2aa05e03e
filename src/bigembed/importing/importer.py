"""``bigembed import``: edge lists (TSV/CSV/Parquet) -> entity store + bucketed edge stores.

Pass 1 (:mod:`~bigembed.importing.collect`) reads each input once and spills integer codes;
then relations and entities are finalised (min-counts, seeded partition assignment, entity
files); pass 2 (:mod:`~bigembed.importing.bucketing`) turns each input's spill into its shuffled
buckets. Everything is built in temporary places and published together
(:mod:`~bigembed.importing.publish`), after :mod:`~bigembed.importing.dependents` has checked
that replacing an existing store orphans no checkpoint trained on it. docs/FORMAT.md describes
the passes and the files.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from bigembed.config import relation_list
from bigembed.edgelists import (
    WRONG_WIDTH,
    BadColumnCount,
    ColumnSpec,
    InputFile,
    TextOptions,
    detect_format,
    first_wrong_width,
    header_suspicion,
    lines_of_rows,
    location,
)
from bigembed.errors import BigembedError, ConfigError, InputError
from bigembed.importing.bucketing import BucketWriter, RunProcessor, SideMap
from bigembed.importing.collect import BadRow, Collector, FileStats, SideTypes
from bigembed.importing.dependents import check_replacement, restamp
from bigembed.importing.dictionary import NUM_SHARDS, ShardedDictionary
from bigembed.importing.extension import (
    extend_assignment,
    extended_relations,
    extension_record,
)
from bigembed.importing.features import (
    build_features,
    check_feature_files,
    read_pairs,
    write_type_features,
)
from bigembed.importing.partitioning import Assignment, assign_partitions
from bigembed.importing.publish import Publisher, planned_entity_files
from bigembed.importing.relations import RelationMapper
from bigembed.importing.runs import RunFiles
from bigembed.output_paths import path_within, refuse_overlap, write_error
from bigembed.storage import (
    FEATURES_KEY,
    EntityStore,
    index_dtype,
    write_edge_manifest,
    write_entity_store,
)

if TYPE_CHECKING:
    from bigembed.config import ConfigSchema

logger = logging.getLogger(__name__)


@dataclass
class ImportOptions:
    inputs: list[Path]
    format: str | None = None
    columns: ColumnSpec = field(default_factory=ColumnSpec)
    text: TextOptions = field(default_factory=TextOptions)
    entity_min_count: int = 1
    relation_type_min_count: int = 1
    skip_bad_lines: bool = False
    force: bool = False
    allow_orphans: bool = False  # --force may replace a store that checkpoints were trained on
    extend: bool = False  # append new entities to the existing store (old ids kept)
    progress: bool = True
    buffer_edges: int = 2_000_000  # edges buffered in memory between dictionary merges
    run_edges: int = 2_000_000  # edges shuffled in memory at once in the bucketing pass
    features: dict[str, Path] = field(default_factory=dict)  # featurized type -> features file


@dataclass
class InputReport:
    path: Path
    edge_path: Path
    edges: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    dropped_min_count: int = 0


@dataclass
class ImportSummary:
    entities: dict[str, int]
    relations: int
    inputs: list[InputReport]
    dropped_entities: dict[str, int]
    dropped_relations: list[str]
    seconds: float

    @property
    def total_edges(self) -> int:
        return sum(r.edges for r in self.inputs)

    def format(self) -> str:
        lines = ["import summary:"]
        for etype, count in self.entities.items():
            extra = (
                f" ({self.dropped_entities[etype]:,} dropped by --entity-min-count)"
                if self.dropped_entities.get(etype)
                else ""
            )
            lines.append(f"  entities {etype}: {count:,}{extra}")
        extra = (
            f" ({len(self.dropped_relations)} dropped by --relation-type-min-count)"
            if self.dropped_relations
            else ""
        )
        lines.append(f"  relation types: {self.relations:,}{extra}")
        for r in self.inputs:
            lines.append(f"  edges {r.edge_path}: {r.edges:,} (from {r.path})")
            if r.dropped_min_count:
                lines.append(
                    f"    {r.dropped_min_count:,} edges dropped: an entity or relation of theirs "
                    f"is below a min-count"
                )
            for why, count in sorted(r.skipped.items()):
                lines.append(f"    skipped {count:,} bad lines: {why}")
            for example in r.examples:
                lines.append(f"      e.g. {example}")
        rate = self.total_edges / self.seconds if self.seconds > 0 else 0.0
        lines.append(f"  {self.total_edges:,} edges in {self.seconds:.1f} s ({rate:,.0f} edges/s)")
        return "\n".join(lines)


def _peak_rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _side_types(cfg: ConfigSchema, type_index: dict[str, int], side: str) -> SideTypes:
    types = [type_index[getattr(r, side)] for r in cfg.relations]
    if cfg.dynamic_relations or len(set(types)) == 1:
        return SideTypes(constant=types[0])
    return SideTypes(constant=None, by_relation=np.array(types, dtype=np.int32))


def _bad_row_error(exc: BadRow) -> InputError:
    source = exc.source
    return InputError(f"{location(source, exc.row)}: {exc.why}")


def _bad_width_error(source: InputFile) -> InputError:
    found = first_wrong_width(source)
    if found is None:
        return InputError(f"{source.path}: {WRONG_WIDTH}: {source.bad_columns.first_text!r}")
    line, width, expected = found
    return InputError(f"{source.path}:{line}: {WRONG_WIDTH}: expected {expected}, got {width}")


class Importer:
    """One import run; see :func:`run_import`."""

    def __init__(self, cfg: ConfigSchema, options: ImportOptions) -> None:
        self.cfg = cfg
        self.opt = options
        if len(options.inputs) != len(cfg.edge_paths):
            raise InputError(
                f"got {len(options.inputs)} input file(s) but the config has "
                f"{len(cfg.edge_paths)} edge_paths: give one input per edge path, in order "
                f"({', '.join(cfg.edge_paths)})"
            )
        if options.columns.rel is None and len(cfg.relations) != 1:
            raise InputError(
                f"no relation column (--rel-col) but the config has {len(cfg.relations)} "
                f"relations; give --rel-col or configure a single relation"
            )
        self.entity_path = Path(cfg.entity_path)
        self.edge_paths = [Path(p) for p in cfg.edge_paths]
        resolved = [p.resolve() for p in self.edge_paths]
        if len(set(resolved)) != len(resolved):
            raise ConfigError("edge_paths: the same directory appears twice")
        if self.entity_path.resolve() in resolved:
            raise ConfigError("edge_paths: an edge path must differ from entity_path")
        for k, edge_path in enumerate(self.edge_paths):
            # publishing an edge store replaces its directory: nothing else may live in it
            for other in [self.entity_path, *self.edge_paths[:k], *self.edge_paths[k + 1 :]]:
                if path_within(other, edge_path):
                    raise ConfigError(
                        f"edge_paths: {other} lies inside the edge path {edge_path}; "
                        f"keep each edge path apart from entity_path and the other edge paths"
                    )
        # no output may be, hold or lie inside an input file (the entity path itself may hold
        # the inputs: only its entity files are written)
        parts = {t: e.num_partitions for t, e in cfg.entities.items()}
        entity_files = [self.entity_path / n for n in planned_entity_files(parts)]
        refuse_overlap([*self.edge_paths, *entity_files], options.inputs)
        for path in options.inputs:
            if path_within(self.entity_path, path):
                refuse_overlap([self.entity_path], [path])
        check_feature_files(cfg, options.features)
        self.import_id: str | None = None
        self.extending = _store_to_extend(cfg) if options.extend else None
        self.type_names = list(cfg.entities)
        self.type_index = {t: i for i, t in enumerate(self.type_names)}

    def run(self) -> ImportSummary:
        start = time.monotonic()
        sources = []
        for path in self.opt.inputs:
            fmt, compression = detect_format(path, self.opt.format)
            sources.append(
                InputFile(
                    path,
                    fmt,
                    compression,
                    self.opt.columns,
                    self.opt.text,
                    skip_bad_lines=self.opt.skip_bad_lines,
                )
            )
        for source in sources:
            why = header_suspicion(source)
            if why is not None:
                logger.warning(
                    "%s: the first line looks like a header (%s); pass --header if it is",
                    source.path,
                    why,
                )
        force = self.opt.force or self.opt.extend  # an extension replaces the stores it extends
        publisher = Publisher(self.entity_path, self.edge_paths, force=force)
        try:
            publisher.check()
        except OSError as exc:
            raise write_error(exc, self.entity_path, "import's outputs") from None
        try:
            work = publisher.begin()
            summary = self._run(sources, work, publisher)
            assert self.import_id is not None
            extends = [] if self.extending is None else [self.extending.import_id]
            kept_id = check_replacement(
                self.entity_path,
                self.import_id,
                allow_orphans=self.opt.allow_orphans,
                extends=[i for i in extends if i is not None],
            )
            if kept_id != self.import_id:
                restamp(publisher, kept_id)
                self.import_id = kept_id
            t0 = time.monotonic()
            publisher.publish(self.import_id)
            logger.debug("publish: %.2f s", time.monotonic() - t0)
        except OSError as exc:
            publisher.abort()
            raise self._os_error(exc) from None
        except BaseException:
            publisher.abort()
            raise
        summary.seconds = time.monotonic() - start
        return summary

    def _os_error(self, exc: OSError) -> BigembedError:
        """A file-system error as a one-line error naming the path (an input or an output)."""
        if exc.filename is not None:
            name = Path(os.fsdecode(exc.filename))
            if any(name == p or name.resolve() == p.resolve() for p in self.opt.inputs):
                return InputError(f"{name}: cannot read ({exc.strerror or exc})")
        return write_error(exc, self.entity_path, "import's outputs")

    def _run(self, sources: list[InputFile], work: Path, publisher: Publisher) -> ImportSummary:
        cfg, opt = self.cfg, self.opt
        relations = RelationMapper([r.name for r in cfg.relations], dynamic=cfg.dynamic_relations)
        collector = Collector(
            num_types=len(self.type_names),
            lhs=_side_types(cfg, self.type_index, "lhs"),
            rhs=_side_types(cfg, self.type_index, "rhs"),
            relations=relations,
            count_entities=opt.entity_min_count > 1,
            skip_bad_lines=opt.skip_bad_lines,
            seed=cfg.seed,
            buffer_edges=opt.buffer_edges,
            run_edges=opt.run_edges,
        )
        reports = [InputReport(s.path, e) for s, e in zip(sources, self.edge_paths, strict=True)]
        t0 = time.monotonic()
        all_runs = [
            self._collect(collector, source, k, work, reports[k])
            for k, source in enumerate(sources)
        ]
        logger.debug("pass 1: %.2f s, peak RSS %d MB", time.monotonic() - t0, _peak_rss_mb())

        t0 = time.monotonic()
        rel_names, rel_remap, dropped_rels = relations.finish(opt.relation_type_min_count)
        if not rel_names:
            raise InputError(
                f"no relation type has at least --relation-type-min-count="
                f"{opt.relation_type_min_count} edges"
            )
        if opt.relation_type_min_count > 1 and not cfg.dynamic_relations:
            logger.warning("--relation-type-min-count applies to dynamic relations only; ignored")
        if dropped_rels and opt.entity_min_count > 1:
            _recount(collector, all_runs, rel_remap)
        extra = None
        if self.extending is not None:
            rel_names, rel_remap = extended_relations(
                self.extending, rel_names, rel_remap, cfg.dynamic_relations
            )
        assignments, bases, dropped_entities = self._assign(collector)
        if self.extending is not None:
            old = self.extending
            grown = any(a.counts != old.counts(t) for t, a in assignments.items())
            extra = extension_record(old, grown)
        features = {
            etype: build_features(read_pairs(path), assignments[etype].names)
            for etype, path in opt.features.items()
        }
        if features:
            extra = (extra or {}) | {
                FEATURES_KEY: {t: {"num_features": len(f.names)} for t, f in features.items()}
            }
        self.import_id = write_entity_store(
            work / "entities",
            names={etype: a.names for etype, a in assignments.items()},
            relation_names=rel_names,
            dynamic_relations=cfg.dynamic_relations,
            seed=cfg.seed,
            extra=extra,
        )
        write_type_features(work / "entities", features)
        logger.debug(
            "entities and partitions: %.2f s, peak RSS %d MB", time.monotonic() - t0, _peak_rss_mb()
        )

        t0 = time.monotonic()
        shard_base, part_of, offset_of = self._id_space(assignments, bases)
        max_count = max([max(a.counts, default=0) for a in assignments.values()], default=0)
        offset_of = offset_of.astype(index_dtype(max_count))
        sides = [
            SideMap(shard_base, part_of, offset_of, side.constant, side.by_relation)
            for side in (collector.lhs, collector.rhs)
        ]
        dtypes = {
            "lhs": index_dtype(max_count),
            "rhs": index_dtype(max_count),
            "rel": index_dtype(len(rel_names)),
        }
        if opt.columns.weight is not None:
            dtypes["weight"] = np.dtype(np.float32)
        for k, runs in enumerate(all_runs):
            remap = rel_remap if cfg.dynamic_relations else None
            self._bucket(runs, k, sides, remap, dtypes, publisher.edge_staging[k], reports[k])
        logger.debug("bucketing: %.2f s, peak RSS %d MB", time.monotonic() - t0, _peak_rss_mb())
        return ImportSummary(
            entities={etype: sum(a.counts) for etype, a in assignments.items()},
            relations=len(rel_names),
            inputs=reports,
            dropped_entities=dropped_entities,
            dropped_relations=dropped_rels,
            seconds=0.0,
        )

    def _collect(
        self, collector: Collector, source: InputFile, k: int, work: Path, report: InputReport
    ) -> RunFiles:
        """Pass 1 over one input, with its progress bar and its bad-line report."""
        with tqdm(
            total=source.total_for_progress(),
            unit="rows" if source.fmt == "parquet" else "B",
            unit_scale=True,
            disable=not self.opt.progress,
            desc=f"read {source.path.name}",
            leave=False,
        ) as bar:
            try:
                runs, stats = collector.collect(source, k, work / "spill" / str(k), bar)
            except BadRow as exc:
                raise _bad_row_error(exc) from None
            except BadColumnCount:
                raise _bad_width_error(source) from None
        _report_file(source, stats, report)
        return runs

    def _assign(
        self, collector: Collector
    ) -> tuple[dict[str, Assignment], dict[str, np.ndarray], dict[str, int]]:
        """Min-count filter and partition assignment per type; frees the dictionaries."""
        assignments: dict[str, Assignment] = {}
        bases: dict[str, np.ndarray] = {}
        dropped: dict[str, int] = {}
        min_count = self.opt.entity_min_count
        for t, etype in enumerate(self.type_names):
            dictionary = collector.dictionaries[t]
            keep = None
            if min_count > 1:
                keep = dictionary.all_counts() >= min_count
                dropped[etype] = int((~keep).sum())
            if self.extending is not None:
                assignments[etype] = extend_assignment(
                    self.extending, etype, dictionary.names(), keep, self.cfg.seed
                )
            else:
                assignments[etype] = assign_partitions(
                    dictionary.names(),
                    keep,
                    self.cfg.entities[etype].num_partitions,
                    self.cfg.seed,
                    etype,
                )
            bases[etype] = dictionary.bases()
            collector.dictionaries[t] = ShardedDictionary(count=False)
        return assignments, bases, dropped

    def _bucket(
        self,
        runs: RunFiles,
        k: int,
        sides: list[SideMap],
        rel_remap: np.ndarray | None,
        dtypes: dict[str, np.dtype],
        staging: Path,
        report: InputReport,
    ) -> None:
        """Pass 2 for one input: its runs -> the bucket files and manifest of its edge path."""
        has_weights = "weight" in dtypes
        lhs_parts = max(self.cfg.entities[r.lhs].num_partitions for r in self.cfg.relations)
        rhs_parts = max(self.cfg.entities[r.rhs].num_partitions for r in self.cfg.relations)
        writer = BucketWriter(staging, lhs_parts, rhs_parts, dtypes, has_weights)
        processor = RunProcessor(
            lhs=sides[0],
            rhs=sides[1],
            rel_remap=rel_remap,
            writer=writer,
            run_edges=self.opt.run_edges,
            seed=self.cfg.seed,
        )
        with tqdm(
            total=int(runs.sizes.sum()),
            unit="edges",
            unit_scale=True,
            disable=not self.opt.progress,
            desc=f"bucket {self.edge_paths[k].name}",
            leave=False,
        ) as bar:
            processor.process_all(runs, k, bar)
        counts = writer.finish()
        write_edge_manifest(
            staging,
            bucket_counts=counts,
            dtypes=dtypes,
            has_weights=has_weights,
            extra={
                "seed": self.cfg.seed,
                "source": str(report.path),
                "shuffled": True,
                "import_id": self.import_id,
                "relations": relation_list(self.cfg),
            },
        )
        report.edges = int(counts.sum())
        report.dropped_min_count = processor.dropped

    def _id_space(
        self, assignments: dict[str, Assignment], bases: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first id of each (type, shard), partition per id, offset per id) over all types."""
        shard_base, parts, offsets = [], [], []
        start = 0
        for etype in self.type_names:
            a = assignments[etype]
            shard_base.append(bases[etype] + start)
            parts.append(a.part_of)
            offsets.append(a.offset_of)
            start += len(a.part_of)
        return np.concatenate(shard_base), np.concatenate(parts), np.concatenate(offsets)


def _store_to_extend(cfg: ConfigSchema) -> EntityStore:
    """The entity store ``--extend`` appends to, checked against the config's entity types."""
    store = EntityStore(cfg.entity_path)  # a missing store: "no manifest", naming the path
    if set(store.entity_types) != set(cfg.entities):
        raise InputError(
            f"{cfg.entity_path}: holds the entity types {sorted(store.entity_types)}, the config "
            f"{sorted(cfg.entities)}; --extend keeps the entity types (import into another "
            "entity_path to change them)"
        )
    for etype, entity in cfg.entities.items():
        if store.num_partitions(etype) != entity.num_partitions:
            raise InputError(
                f"{cfg.entity_path}: entity type {etype!r} has {store.num_partitions(etype)} "
                f"partition(s) but the config gives {entity.num_partitions}; --extend keeps "
                "the partitioning"
            )
    return store


def _recount(collector: Collector, all_runs: list[RunFiles], rel_remap: np.ndarray) -> None:
    """Entity counts without the edges of dropped relations (dynamic mode only)."""
    for d in collector.dictionaries:
        d.counts = [np.zeros(len(s), dtype=np.int64) for s in d.shards]
    t_l, t_r = collector.lhs.constant, collector.rhs.constant
    assert t_l is not None and t_r is not None  # dynamic: one type per side
    for runs in all_runs:
        for run in range(runs.num_runs):
            cols = runs.read(run)
            keep = rel_remap[cols["rel"]] >= 0
            for t, s, i in ((t_l, "ls", "li"), (t_r, "rs", "ri")):
                d = collector.dictionaries[t]
                ids = d.bases()[cols[s][keep]] + cols[i][keep]
                counts = np.bincount(ids, minlength=len(d))
                bases = d.bases()
                for shard in range(NUM_SHARDS):
                    lo = bases[shard]
                    d.counts[shard] += counts[lo : lo + len(d.shards[shard])]


def _report_file(source: InputFile, stats: FileStats, report: InputReport) -> None:
    report.skipped = Counter(stats.bad)
    if source.bad_columns.count:
        report.skipped[WRONG_WIDTH] += source.bad_columns.count
    if not report.skipped:
        return
    rows = [row for row, _ in stats.examples]
    lines = lines_of_rows(source, rows) if source.fmt != "parquet" else {}
    report.examples = [
        f"{location(source, row, lines.get(row))}: {why}" for row, why in stats.examples
    ]
    if source.bad_columns.count and len(report.examples) < 5:
        found = first_wrong_width(source)
        if found is not None:
            line, width, expected = found
            report.examples.append(
                f"{source.path}:{line}: {WRONG_WIDTH}: expected {expected}, got {width}"
            )


def run_import(cfg: ConfigSchema, options: ImportOptions) -> ImportSummary:
    """Import ``options.inputs`` (one per ``cfg.edge_paths`` entry) and publish the stores."""
    return Importer(cfg, options).run()
