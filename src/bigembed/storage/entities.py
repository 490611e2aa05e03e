"""The entity store: how many entities each (type, partition) holds and what they are called.

Layout of ``entity_path`` (see docs/FORMAT.md): ``manifest.json``, PBG-compatible
``entity_count_{type}_{part}.txt``, ``dynamic_rel_count.txt`` and ``dynamic_rel_names.json``,
and ``entity_names_{type}_{part}.parquet`` (names in offset order; Parquet because a JSON list
of a billion names cannot be read in pieces).

Each import gets an ``import_id`` (a random id plus a digest of the entity files, hashed while
they are written) recorded in the manifest; the edge stores bucketed against this store record
it too, so a mix of stores from different imports is detected
(:func:`bigembed.storage.edges.check_edges_import`).
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
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
            self.import_id: str | None = None if found is None else str(found)
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

    @property
    def num_relations(self) -> int:
        return len(self._relations)

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


class _HashingWriter(io.RawIOBase):
    """A binary file that also feeds every byte written to a hash."""

    def __init__(self, raw: io.BufferedWriter, digest: Any) -> None:
        self._raw = raw
        self._digest = digest

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._digest.update(data)
        return self._raw.write(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _write_text(path: Path, text: str, digest: Any) -> None:
    data = text.encode("utf-8")
    digest.update(data)
    path.write_bytes(data)


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
    Returns the store's new ``import_id`` (also in its manifest).
    """
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    types: dict[str, Any] = {}
    for entity_type, parts in names.items():
        counts = []
        for part, array in enumerate(parts):
            table = pa.table(
                {"name": array.cast(pa.string()) if array.type != pa.string() else array}
            )
            names_file = entity_names_file(entity_type, part)
            digest.update(names_file.encode("utf-8"))
            with open(directory / names_file, "wb") as raw, _HashingWriter(raw, digest) as f:
                pq.write_table(table, f)
            _write_text(directory / entity_count_file(entity_type, part), f"{len(array)}\n", digest)
            counts.append(len(array))
        types[entity_type] = {"num_partitions": len(parts), "counts": counts}
    _write_text(directory / DYNAMIC_REL_COUNT, f"{len(relation_names)}\n", digest)
    _write_text(directory / DYNAMIC_REL_NAMES, json.dumps(list(relation_names)) + "\n", digest)
    import_id = f"{uuid.uuid4().hex}-{digest.hexdigest()[:32]}"
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
