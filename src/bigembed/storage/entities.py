"""The entity store: how many entities each (type, partition) holds and what they are called.

Layout of ``entity_path`` (see docs/FORMAT.md): ``manifest.json``, PBG-compatible
``entity_count_{type}_{part}.txt``, ``dynamic_rel_count.txt`` and ``dynamic_rel_names.json``,
and ``entity_names_{type}_{part}.parquet`` (names in offset order; Parquet because a JSON list
of a billion names cannot be read in pieces).

Each import gets an ``import_id`` recorded in the manifest: a digest of what the ids mean
(:func:`content_import_id`: every entity name with its type, partition and offset, and the
relation names), so importing the same entities again gives the same id and a model trained on
the first import stays usable. The edge stores bucketed against this store record it too, so a
mix of stores from different imports is detected
(:func:`bigembed.storage.edges.check_edges_import`); a checkpoint records it as well.
Stores written before content-derived ids carry a random id (:func:`is_legacy_import_id`).

A store made by ``bigembed import --extend`` records in ``extends`` every import it extends
(:class:`Extension`, oldest first): each one's id and counts per partition. The entities of
such an import are the first ``counts[type][part]`` names of each partition here, with the same
offsets, so a model trained on it is a prefix of this store (``bigembed train`` grows it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bigembed.errors import InputError
from bigembed.partition_keys import PartitionKey
from bigembed.storage.features import (
    FEATURES_KEY,
    FeatureCSR,
    read_feature_names,
    read_features,
)
from bigembed.storage.format import (
    DYNAMIC_REL_COUNT,
    DYNAMIC_REL_NAMES,
    ENTITY_FORMAT,
    FORMAT_VERSION,
    IMPORT_ID,
    MANIFEST,
    entity_count_file,
    entity_names_file,
    manifest_error,
    read_manifest,
)


@dataclass(frozen=True)
class Extension:
    """An import this store extends: its id and its entity counts per type and partition (its
    entities are the first ``counts[type][part]`` of each partition here)."""

    import_id: str
    counts: dict[str, tuple[int, ...]]

    def to_json(self) -> dict[str, Any]:
        return {"import_id": self.import_id, "counts": {t: list(c) for t, c in self.counts.items()}}


EXTENDS = "extends"  # manifest key: the imports this store extends, oldest first


@dataclass(frozen=True)
class EntityTypeInfo:
    num_partitions: int
    counts: tuple[int, ...]


class EntityStore:
    """Read access to an imported entity path."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        data = read_manifest(self.path, ENTITY_FORMAT)
        try:
            self._types = {
                str(name): EntityTypeInfo(
                    int(info["num_partitions"]), tuple(int(c) for c in info["counts"])
                )
                for name, info in data["entity_types"].items()
            }
            self._relations = [str(r) for r in data["relations"]]
            self.dynamic_relations = bool(data["dynamic_relations"])
            self.seed = int(data.get("seed", 0))
            found = data.get(IMPORT_ID)
            self._num_features = {
                str(t): int(v["num_features"]) for t, v in data.get(FEATURES_KEY, {}).items()
            }
            self.import_id: str | None = None if found is None else str(found)
            self.extends = [
                Extension(
                    str(e["import_id"]),
                    {str(t): tuple(int(c) for c in cs) for t, cs in e["counts"].items()},
                )
                for e in data.get(EXTENDS, [])
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise manifest_error(self.path, f"bad or missing field: {exc}") from None
        for name, info in self._types.items():
            if len(info.counts) != info.num_partitions:
                raise manifest_error(self.path, f"entity type {name!r}: counts/partitions mismatch")
        self._name_cache: dict[PartitionKey, pa.Array] = {}

    # ---- shape
    @property
    def entity_types(self) -> list[str]:
        return list(self._types)

    def _info(self, entity_type: str) -> EntityTypeInfo:
        try:
            return self._types[entity_type]
        except KeyError:
            known = ", ".join(self._types) or "none"
            raise InputError(
                f"{self.path}: no entity type {entity_type!r} (known: {known}); "
                f"re-run `bigembed import` after changing the config's entities"
            ) from None

    def num_partitions(self, entity_type: str) -> int:
        return self._info(entity_type).num_partitions

    def count(self, entity_type: str, part: int) -> int:
        info = self._info(entity_type)
        if not 0 <= part < info.num_partitions:
            raise IndexError(f"{entity_type!r} has {info.num_partitions} partitions, not {part}")
        return info.counts[part]

    def counts(self, entity_type: str) -> list[int]:
        return list(self._info(entity_type).counts)

    def total(self, entity_type: str) -> int:
        return sum(self._info(entity_type).counts)

    def relation_names(self) -> list[str]:
        return list(self._relations)

    def extension_of(self, import_id: str | None) -> Extension | None:
        """The record of ``import_id`` if this store extends that import (None otherwise)."""
        return next((e for e in self.extends if e.import_id == import_id), None)

    @property
    def num_relations(self) -> int:
        return len(self._relations)

    # ---- features (featurized types, see bigembed.storage.features)
    def is_featurized(self, entity_type: str) -> bool:
        return entity_type in self._num_features

    def num_features(self, entity_type: str) -> int:
        """Rows of the feature table of a featurized type."""
        if entity_type not in self._num_features:
            raise InputError(
                f"{self.path}: entity type {entity_type!r} was imported without features; "
                f"re-run `bigembed import --features {entity_type}=FILE`"
            )
        return self._num_features[entity_type]

    def features(self, entity_type: str, part: int) -> FeatureCSR:
        """The feature bags of one partition of a featurized type."""
        return read_features(
            self.path,
            entity_type,
            part,
            self.count(entity_type, part),
            self.num_features(entity_type),
        )

    def feature_names(self, entity_type: str) -> list[str]:
        """The feature dictionary of a featurized type, index = feature id."""
        return read_feature_names(self.path, entity_type, self.num_features(entity_type))

    # ---- names
    def names_array(self, entity_type: str, part: int) -> pa.Array:
        """Names of one partition as a pyarrow string array, index = offset (cached)."""
        key = (entity_type, part)
        cached = self._name_cache.get(key)
        if cached is not None:
            return cached
        expected = self.count(entity_type, part)
        path = self.path / entity_names_file(entity_type, part)
        try:
            column = pq.read_table(path, columns=["name"]).column("name")
        except FileNotFoundError:
            raise InputError(f"{path}: missing (the entity store is incomplete)") from None
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise InputError(f"{path}: unreadable entity names ({exc})") from None
        names = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if len(names) != expected:
            raise InputError(f"{path}: holds {len(names)} names but the manifest says {expected}")
        self._name_cache[key] = names
        return names

    def names(self, entity_type: str, part: int) -> list[str]:
        """Names of one partition, index = offset."""
        return self.names_array(entity_type, part).to_pylist()

    def name_to_offset(self, entity_type: str, part: int) -> dict[str, int]:
        """A dict from name to offset for one partition (fine for query tools, not billions)."""
        return {name: i for i, name in enumerate(self.names(entity_type, part))}

    def lookup(
        self, entity_type: str, names: Sequence[str] | pa.Array
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised (partition, offset) of each name; -1, -1 for unknown names."""
        values = names if isinstance(names, pa.Array) else pa.array(list(names), pa.string())
        parts = np.full(len(values), -1, dtype=np.int64)
        offsets = np.full(len(values), -1, dtype=np.int64)
        for part in range(self.num_partitions(entity_type)):
            found = pc.index_in(values, value_set=self.names_array(entity_type, part))
            idx = pc.fill_null(found, -1).to_numpy().astype(np.int64)
            hit = (idx >= 0) & (parts < 0)
            parts[hit] = part
            offsets[hit] = idx[hit]
        return parts, offsets

    def offset_of(self, entity_type: str, name: str) -> tuple[int, int] | None:
        """(partition, offset) of one entity, or None if the store does not know it."""
        parts, offsets = self.lookup(entity_type, [name])
        return None if parts[0] < 0 else (int(parts[0]), int(offsets[0]))


IDENTITY_VERSION = "content-v1"  # bump when the digested content changes
_LENGTHS_CHUNK = 1 << 20  # names whose lengths are hashed at once
_LEGACY_ID = re.compile(r"^[0-9a-f]{32}-[0-9a-f]{32}$")


def is_legacy_import_id(import_id: str) -> bool:
    """Whether ``import_id`` is a random id of a store written before content-derived ids
    (``{uuid}-{digest}``): no import can reproduce it."""
    return _LEGACY_ID.match(import_id) is not None


def _feed_names(digest: Any, array: pa.Array) -> None:
    """Hash every name of ``array`` in order, each with its length (no separator ambiguity)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.type != pa.string():
        array = array.cast(pa.string())
    for start in range(0, len(array), _LENGTHS_CHUNK):  # bounded memory for huge partitions
        piece = pc.fill_null(pc.binary_length(array.slice(start, _LENGTHS_CHUNK)), -1)
        digest.update(piece.to_numpy(zero_copy_only=False).astype("<i8").tobytes())
    if len(array) == 0:
        return
    first = array.offset
    offsets = np.frombuffer(array.buffers()[1], dtype="<i4")[first : first + 1 + len(array)]
    data = array.buffers()[2]
    if data is not None:
        digest.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])


def content_import_id(
    names: Mapping[str, Sequence[pa.Array]],
    relation_names: Sequence[str],
    dynamic_relations: bool,
) -> str:
    """The import id of an entity store: a digest of every name with its (type, partition,
    offset), of the relation names and of whether they are dynamic.

    Two imports get the same id exactly when every entity id and relation id means the same
    thing in both, so a model trained on one can be used with the other; the file bytes (which
    depend on the Parquet writer's version) do not enter it.
    """
    digest = hashlib.sha256(f"bigembed import identity {IDENTITY_VERSION}\n".encode())
    shape = {
        "dynamic_relations": bool(dynamic_relations),
        "relations": list(relation_names),
        "entity_types": {t: [len(a) for a in parts] for t, parts in names.items()},
    }
    digest.update(json.dumps(shape, sort_keys=True).encode("utf-8"))
    for entity_type in sorted(names):
        for part, array in enumerate(names[entity_type]):
            digest.update(f"\n{entity_type}\0{part}\n".encode())
            _feed_names(digest, array)
    return f"content-{digest.hexdigest()[:40]}"


def write_entity_store(
    directory: Path,
    *,
    names: Mapping[str, Sequence[pa.Array]],
    relation_names: Sequence[str],
    dynamic_relations: bool,
    seed: int,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Write every file of an entity store into ``directory`` (the manifest last).

    ``names[type][part]`` is the string array of that partition's names in offset order.
    Returns the store's ``import_id`` (:func:`content_import_id`; also in its manifest).
    """
    directory.mkdir(parents=True, exist_ok=True)
    types: dict[str, Any] = {}
    for entity_type, parts in names.items():
        counts = []
        for part, array in enumerate(parts):
            table = pa.table(
                {"name": array.cast(pa.string()) if array.type != pa.string() else array}
            )
            pq.write_table(table, directory / entity_names_file(entity_type, part))
            (directory / entity_count_file(entity_type, part)).write_text(f"{len(array)}\n")
            counts.append(len(array))
        types[entity_type] = {"num_partitions": len(parts), "counts": counts}
    (directory / DYNAMIC_REL_COUNT).write_text(f"{len(relation_names)}\n")
    (directory / DYNAMIC_REL_NAMES).write_text(json.dumps(list(relation_names)) + "\n")
    import_id = content_import_id(names, relation_names, dynamic_relations)
    manifest: dict[str, Any] = {
        "format": ENTITY_FORMAT,
        "format_version": FORMAT_VERSION,
        IMPORT_ID: import_id,
        "seed": seed,
        "dynamic_relations": dynamic_relations,
        "relations": list(relation_names),
        "entity_types": types,
    }
    if extra:
        manifest.update(extra)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return import_id
