"""Reading a featurized type's entity -> features file and building its bags (CSR).

Formats (docs/FORMAT.md, "Entity features"):

* text (any name but ``*.parquet``), tab-separated, one entity per line or one pair per line:
  ``entity<TAB>feat1 feat2 ...`` (the features separated by spaces, weight 1 each) or
  ``entity<TAB>feature<TAB>weight``; an entity may appear on several lines (its features add
  up, a repeated feature's weights are summed); empty lines and lines starting with ``#`` are
  skipped;
* Parquet: a string column ``entity``, a list-of-strings column ``features`` and optionally a
  list-of-numbers column ``weights`` of the same lengths.

Weights must be positive; each bag's weights are normalised to sum 1, so an entity's embedding
is the weighted mean of its features'. Entities of the file the graph does not have are
ignored; the graph's entities the file does not name get an empty bag (the zero embedding).
The feature dictionary holds the features of the graph's entities only, sorted by name. The
file is read into memory (it is one row per entity, much smaller than the edges).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bigembed.errors import ConfigError, InputError
from bigembed.model import normalise_bag_weights
from bigembed.storage import FeatureCSR, write_feature_names, write_features

if TYPE_CHECKING:
    from bigembed.config import ConfigSchema

logger = logging.getLogger(__name__)


@dataclass
class FeaturePairs:
    """Every (entity, feature, weight) triple of a features file."""

    entities: list[str]
    features: list[str]
    weights: list[float]


def _weight(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: weight {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: weight {text!r} must be a positive number")
    return value


def read_text_pairs(path: Path) -> FeaturePairs:
    """The pairs of a tab-separated features file (see the module docstring)."""
    out = FeaturePairs([], [], [])
    try:
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, start=1):
                line = raw.rstrip("\r\n")
                if not line.strip() or line.startswith("#"):
                    continue
                where = f"{path}:{number}"
                fields = line.split("\t")
                entity = fields[0].strip()
                if not entity:
                    raise InputError(f"{where}: empty entity name")
                if len(fields) == 2:
                    feats = fields[1].split()
                    if not feats:
                        raise InputError(f"{where}: no features after the tab")
                    out.entities += [entity] * len(feats)
                    out.features += feats
                    out.weights += [1.0] * len(feats)
                elif len(fields) == 3:
                    feature = fields[1].strip()
                    if not feature:
                        raise InputError(f"{where}: empty feature name")
                    out.entities.append(entity)
                    out.features.append(feature)
                    out.weights.append(_weight(fields[2].strip(), where))
                else:
                    raise InputError(
                        f"{where}: expected 'entity<TAB>feat1 feat2 ...' or "
                        f"'entity<TAB>feature<TAB>weight', got {len(fields)} tab-separated fields"
                    )
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return out


def read_parquet_pairs(path: Path) -> FeaturePairs:
    """The pairs of a Parquet features file (columns entity, features[, weights])."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: unreadable Parquet ({exc})") from None
    missing = [c for c in ("entity", "features") if c not in table.column_names]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)} (want entity, features[, weights])"
        )
    entities = table.column("entity").to_pylist()
    features = table.column("features").to_pylist()
    weights = table.column("weights").to_pylist() if "weights" in table.column_names else None
    out = FeaturePairs([], [], [])
    for row, (entity, feats) in enumerate(zip(entities, features, strict=True)):
        where = f"{path}: row {row}"
        if not entity:
            raise InputError(f"{where}: empty entity name")
        if not feats or any(not f for f in feats):
            raise InputError(f"{where}: empty feature list or feature name")
        ws = [1.0] * len(feats) if weights is None else weights[row]
        if ws is None or len(ws) != len(feats):
            raise InputError(f"{where}: weights and features differ in length")
        out.entities += [str(entity)] * len(feats)
        out.features += [str(f) for f in feats]
        out.weights += [_weight(str(w), where) for w in ws]
    return out


def read_pairs(path: Path) -> FeaturePairs:
    if not path.is_file():
        raise InputError(f"{path}: features file not found")
    return read_parquet_pairs(path) if path.suffix == ".parquet" else read_text_pairs(path)


@dataclass
class TypeFeatures:
    """A featurized type's bags (one CSR per partition) and its feature dictionary."""

    csr: list[FeatureCSR]
    names: pa.Array
    unknown_entities: int  # entities of the file the graph does not have
    empty_bags: int  # entities of the graph without features


def build_features(pairs: FeaturePairs, partitions: list[pa.Array]) -> TypeFeatures:
    """Bags of the entities named in ``partitions`` (names per partition, in offset order)."""
    ent = pa.array(pairs.entities, pa.string())
    part_of = np.full(len(ent), -1, dtype=np.int64)
    offset_of = np.full(len(ent), -1, dtype=np.int64)
    for part, names in enumerate(partitions):
        found = pc.fill_null(pc.index_in(ent, value_set=names), -1).to_numpy().astype(np.int64)
        hit = found >= 0
        part_of[hit], offset_of[hit] = part, found[hit]
    known = part_of >= 0
    unknown = len(set(np.asarray(pairs.entities, dtype=object)[~known].tolist()))
    feats = np.asarray(pairs.features, dtype=object)[known]
    names, feature_ids = np.unique(feats.astype(str), return_inverse=True)
    weights = np.asarray(pairs.weights, dtype=np.float64)[known]
    parts, offsets = part_of[known], offset_of[known]
    csrs, empty = [], 0
    for part, part_names in enumerate(partitions):
        sel = parts == part
        ent_off, fid, w = offsets[sel], feature_ids.reshape(-1)[sel], weights[sel]
        count = len(part_names)
        # one entry per (entity, feature): repeated pairs sum their weights
        keys = ent_off * max(len(names), 1) + fid
        uniq, inverse = np.unique(keys, return_inverse=True)
        summed = np.bincount(inverse.reshape(-1), weights=w, minlength=len(uniq))
        bag_ent = uniq // max(len(names), 1)
        lengths = np.bincount(bag_ent, minlength=count)
        offs = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        empty += int((lengths == 0).sum())
        csrs.append(
            FeatureCSR(
                offs,
                (uniq % max(len(names), 1)).astype(np.int64),
                normalise_bag_weights(offs, summed),
            )
        )
    return TypeFeatures(csrs, pa.array(names.tolist(), pa.string()), unknown, empty)


def check_feature_files(cfg: ConfigSchema, files: dict[str, Path]) -> None:
    """Every featurized type has a features file, and only featurized types have one."""
    for etype, path in files.items():
        if etype not in cfg.entities:
            raise InputError(f"--features {etype}={path}: the config has no entity type {etype!r}")
        if not cfg.entities[etype].featurized:
            raise ConfigError(
                f"entities.{etype}.featurized: false, but --features {etype}={path} was given "
                "(set featurized: true to use the features)"
            )
    for etype, schema in cfg.entities.items():
        if schema.featurized and etype not in files:
            raise ConfigError(
                f"entities.{etype}.featurized: true needs its features: pass "
                f"--features {etype}=FILE (format: docs/FORMAT.md, 'Entity features')"
            )


def write_type_features(directory: Path, features: dict[str, TypeFeatures]) -> None:
    """The CSR and dictionary files of every featurized type (see bigembed.storage)."""
    for etype, found in features.items():
        write_feature_names(directory, etype, found.names)
        for part, csr in enumerate(found.csr):
            write_features(directory, etype, part, csr)
        if found.empty_bags:
            logger.warning(
                "%s: %d entities have no features (their embedding is zero)",
                etype,
                found.empty_bags,
            )
        if found.unknown_entities:
            logger.info(
                "%s: %d entities of the features file are not in the graph (ignored)",
                etype,
                found.unknown_entities,
            )
