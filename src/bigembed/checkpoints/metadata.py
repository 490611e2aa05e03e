"""The typed metadata record of one checkpoint version (``metadata.v{N}.json``).

:class:`CheckpointMetadata` is the only place that knows the JSON form: training, conversion and
the distributed trainer build a record and the store writes its :meth:`~CheckpointMetadata.to_json`;
every reader gets a record back from :meth:`~CheckpointMetadata.from_json`, which validates the
file once and raises a :class:`~bigembed.errors.CheckpointError` naming it.

On disk (docs/FORMAT.md, ``format_version`` 1) the keys are ``format_version``, ``version``,
``time``, ``bigembed_version``, ``config``, ``iteration`` (the step's position), ``entity_counts``,
``num_relations``, ``relation_names``, ``import_id`` and, for converted checkpoints,
``converted_from``. ``entity_counts`` is a ``{"{type}_{part}": count}`` mapping on disk and a
``{(type, part): count}`` mapping in the record; :func:`parse_partition_key` is the one parser of
those keys. Missing optional keys (files written by tests, tools or older versions) take their
defaults; unknown keys are ignored, so that a newer writer's additions do not break readers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bigembed import __version__
from bigembed.errors import CheckpointError
from bigembed.partition_keys import PartitionKey

FORMAT_VERSION = 1

PartitionCounts = dict[PartitionKey, int]


def check_same_import(
    checkpoint: str | Path,
    recorded: str | None,
    current: str | None,
    entity_path: str | Path,
) -> None:
    """Refuse a checkpoint trained on another import of ``entity_path`` (other entity ids).

    ``recorded`` is the checkpoint metadata's ``import_id``; None on either side (a checkpoint
    or an entity store from before import ids) cannot be checked and passes.
    """
    if recorded is None or current is None or recorded == current:
        return
    raise CheckpointError(
        f"{checkpoint} was trained on a different import of {entity_path} (import ids differ); "
        "retrain or re-import the original data"
    )


def partition_key_text(entity_type: str, part: int) -> str:
    """The on-disk name of a partition: ``"{type}_{part}"`` (also used in file names)."""
    return f"{entity_type}_{part}"


def parse_partition_key(text: str) -> PartitionKey | None:
    """``"{type}_{part}"`` back to ``(type, part)``; None if it is not of that form.

    The part is the decimal integer after the *last* ``_``: entity type names may themselves
    contain ``_`` (``"user_item_3"`` is partition 3 of ``"user_item"``), but never end the key.
    """
    etype, sep, part = text.rpartition("_")
    if not sep or not etype or not part.isascii() or not part.isdigit():
        return None
    return etype, int(part)


def _fail(path: str | Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: corrupt metadata ({what})")


def _optional_int(value: object, key: str, path: str | Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(path, f"{key} is {value!r}, not a non-negative integer")
    return value


@dataclass(frozen=True)
class IterationPosition:
    """Which (epoch, edge path, edge chunk) step produced a version, and the run's extent.

    Every field may be unknown (None): checkpoints written by tools or converted from PBG need
    not carry all of them. Training writes them all.
    """

    epoch_idx: int | None = None
    num_epochs: int | None = None
    edge_path_idx: int | None = None
    num_edge_paths: int | None = None
    edge_path: str | None = None
    edge_chunk_idx: int | None = None
    num_edge_chunks: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The known fields (unknown ones are left out)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    @classmethod
    def from_json(cls, data: object, path: str | Path) -> IterationPosition:
        """From an ``iteration`` object; keys other than the fields are ignored."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise _fail(path, "iteration is not an object")
        edge_path = data.get("edge_path")
        if edge_path is not None and not isinstance(edge_path, str):
            raise _fail(path, f"iteration.edge_path is {edge_path!r}, not a string")
        ints = {
            f.name: _optional_int(data.get(f.name), f"iteration.{f.name}", path)
            for f in fields(cls)
            if f.name != "edge_path"
        }
        return cls(edge_path=edge_path, **ints)


@dataclass(frozen=True)
class CheckpointMetadata:
    """Everything ``metadata.v{N}.json`` records about checkpoint version ``version``."""

    version: int
    config: dict[str, Any]  # the full job config, as config_to_dict writes it
    iteration: IterationPosition
    entity_counts: PartitionCounts  # rows per (entity type, partition)
    num_relations: int
    relation_names: list[str]
    import_id: str | None = None  # the entity store's import it was trained on (None: unknown)
    bigembed_version: str | None = __version__
    converted_from: dict[str, Any] | None = None  # set by `bigembed convert`
    time: float = field(default_factory=time.time)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to ``metadata.v{N}.json``."""
        data: dict[str, Any] = {
            "format_version": self.format_version,
            "version": self.version,
            "time": self.time,
            "config": self.config,
            "iteration": self.iteration.to_json(),
            "entity_counts": {
                partition_key_text(t, p): n for (t, p), n in self.entity_counts.items()
            },
            "num_relations": self.num_relations,
            "relation_names": list(self.relation_names),
            "import_id": self.import_id,
        }
        if self.bigembed_version is not None:
            data["bigembed_version"] = self.bigembed_version
        if self.converted_from is not None:
            data["converted_from"] = self.converted_from
        return data

    @classmethod
    def from_json(
        cls, data: object, path: str | Path, version: int | None = None
    ) -> CheckpointMetadata:
        """Validate a parsed ``metadata.v{N}.json``; ``path`` names it in every error.

        ``version`` is the version the file name gives, used when the object has none.
        """
        if not isinstance(data, Mapping):
            raise _fail(path, "not a JSON object")
        if data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format {data.get('format_version')} is not supported "
                f"(this bigembed reads format {FORMAT_VERSION})"
            )
        config = data.get("config")
        if not isinstance(config, dict):
            raise _fail(path, "no 'config' object")
        recorded_version = _optional_int(data.get("version"), "version", path)
        if recorded_version is None:
            if version is None:
                raise _fail(path, "no 'version'")
            recorded_version = version
        relations = config.get("relations")
        num_relations = _optional_int(data.get("num_relations"), "num_relations", path)
        if num_relations is None:
            num_relations = len(relations) if isinstance(relations, list) else 0
        names = data.get("relation_names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _fail(path, "relation_names is not a list of strings")
        import_id = data.get("import_id")
        bigembed_version = data.get("bigembed_version")
        converted_from = data.get("converted_from")
        stamp = data.get("time", 0.0)
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            raise _fail(path, f"time is {stamp!r}, not a number")
        return cls(
            version=recorded_version,
            config=config,
            iteration=IterationPosition.from_json(data.get("iteration"), path),
            entity_counts=_entity_counts(data.get("entity_counts", {}), path),
            num_relations=num_relations,
            relation_names=list(names),
            import_id=import_id if isinstance(import_id, str) else None,
            bigembed_version=bigembed_version if isinstance(bigembed_version, str) else None,
            converted_from=converted_from if isinstance(converted_from, dict) else None,
            time=float(stamp),
        )

    def entity_types(self) -> list[str]:
        """The entity types with at least one partition count, in first-seen order."""
        return list(dict.fromkeys(t for t, _ in self.entity_counts))


def _entity_counts(raw: object, path: str | Path) -> PartitionCounts:
    if not isinstance(raw, Mapping):
        raise _fail(path, "entity_counts is not an object")
    counts: PartitionCounts = {}
    for text, count in raw.items():
        key = parse_partition_key(str(text))
        if key is None:
            raise _fail(path, f"entity_counts key {text!r} is not '<type>_<partition>'")
        value = _optional_int(count, f"entity_counts[{text!r}]", path)
        if value is None:
            raise _fail(path, f"entity_counts[{text!r}] is null")
        counts[key] = value
    return counts
