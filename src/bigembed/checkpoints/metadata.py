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
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator, StrictFloat, StrictStr
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from bigembed import __version__
from bigembed.errors import CheckpointError
from bigembed.partition_keys import PartitionKey
from bigembed.serialization import RECORD_CONFIG, JsonForm, NonNegativeInt, omit_none
from bigembed.storage import is_legacy_import_id, previous_import_path

FORMAT_VERSION = 1

PartitionCounts = dict[PartitionKey, int]


def check_same_import(
    checkpoint: str | Path,
    recorded: str | None,
    current: str | None,
    entity_path: str | Path,
    extended_from: Sequence[str] = (),
) -> None:
    """Refuse a checkpoint trained on another import of ``entity_path`` (other entity ids).

    ``recorded`` is the checkpoint metadata's ``import_id``; None on either side (a checkpoint
    or an entity store from before import ids) cannot be checked and passes. Import ids are
    derived from the entities (re-importing the same data gives the same id), so a difference
    means the names changed: the message names ``bigembed remap``, which matches the rows to
    the new names. A random id from before content-derived ids can never match again: unless
    ``import --force`` kept that import's names, the message says how to get them back.
    ``extended_from``: the imports the store extends (``import --extend``); a checkpoint of one
    of them is a prefix of the store, which one-machine ``bigembed train`` grows it to.
    """
    if recorded is None or current is None or recorded == current:
        return
    if recorded in extended_from:
        raise CheckpointError(
            f"{checkpoint} was trained before {entity_path} was extended with new entities "
            "(import --extend); continue it with `bigembed train` on one machine (raise "
            "num_epochs if its training is complete), which grows it to the new entities"
        )
    kept = (previous_import_path(entity_path, recorded) / "manifest.json").is_file()
    if is_legacy_import_id(recorded) and not kept:
        raise CheckpointError(
            f"{checkpoint} was trained on an import of {entity_path} made before bigembed "
            "derived import ids from the data (its id is random, so no re-import matches it): "
            "re-import the original data into another entity_path, then run "
            f"`bigembed remap {checkpoint} --from-entities THAT_ENTITY_PATH`"
        )
    raise CheckpointError(
        f"{checkpoint} was trained on a different import of {entity_path} (import ids differ: "
        f"the entity names changed); run `bigembed remap {checkpoint}` to match its rows to the "
        "new names, or re-import the original data"
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


class _MetadataForm(JsonForm):
    """The metadata records: a file that does not validate is a :class:`CheckpointError`."""

    json_what = "corrupt metadata"

    @classmethod
    def json_error(cls, source: object, detail: str) -> Exception:
        return CheckpointError(f"{source}: {cls.json_what} ({detail})")


@dataclass(frozen=True, config=RECORD_CONFIG)
class IterationPosition(_MetadataForm):
    """Which (epoch, edge path, edge chunk) step produced a version, and the run's extent.

    Every field may be unknown (None, left out of the JSON form): checkpoints written by tools
    or converted from PBG need not carry all of them. Training writes them all.
    """

    epoch_idx: NonNegativeInt | None = omit_none()
    num_epochs: NonNegativeInt | None = omit_none()
    edge_path_idx: NonNegativeInt | None = omit_none()
    num_edge_paths: NonNegativeInt | None = omit_none()
    edge_path: StrictStr | None = omit_none()
    edge_chunk_idx: NonNegativeInt | None = omit_none()
    num_edge_chunks: NonNegativeInt | None = omit_none()


def _entity_counts(raw: object) -> PartitionCounts:
    """``{"{type}_{part}": count}`` (on disk) to ``{(type, part): count}``."""
    if isinstance(raw, Mapping) and all(isinstance(k, tuple) for k in raw):
        return dict(raw)  # a record's own mapping (the constructor)
    if not isinstance(raw, Mapping):
        raise PydanticCustomError("dict_type", "not an object")
    counts: PartitionCounts = {}
    for text, count in raw.items():
        key = parse_partition_key(str(text))
        if key is None:
            raise PydanticCustomError(
                "detail", "{detail}", {"detail": f" key {text!r} is not '<type>_<partition>'"}
            )
        if count is None or isinstance(count, bool) or not isinstance(count, int) or count < 0:
            why = "null" if count is None else f"{count!r}, not a non-negative integer"
            raise PydanticCustomError("detail", "{detail}", {"detail": f"[{text!r}] is {why}"})
        counts[key] = count
    return counts


def _entity_count_texts(counts: PartitionCounts) -> dict[str, int]:
    return {partition_key_text(t, p): n for (t, p), n in counts.items()}


#: Rows per (entity type, partition); on disk keyed by :func:`partition_key_text`.
EntityCounts = Annotated[
    PartitionCounts, PlainValidator(_entity_counts), PlainSerializer(_entity_count_texts)
]


@dataclass(frozen=True, config=RECORD_CONFIG)
class CheckpointMetadata(_MetadataForm):
    """Everything ``metadata.v{N}.json`` records about checkpoint version ``version``."""

    version: NonNegativeInt
    config: dict[str, Any]  # the full job config, as config_to_dict writes it
    iteration: IterationPosition
    entity_counts: EntityCounts  # rows per (entity type, partition)
    num_relations: NonNegativeInt
    relation_names: list[StrictStr]
    import_id: str | None = None  # the entity store's import it was trained on (None: unknown)
    bigembed_version: str | None = omit_none(default=__version__)
    converted_from: dict[str, Any] | None = omit_none()  # set by `bigembed convert`
    time: StrictFloat = field(default_factory=time.time)
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_json(
        cls, data: object, source: object = None, version: int | None = None
    ) -> CheckpointMetadata:
        """Validate a parsed ``metadata.v{N}.json``; ``source`` (its path) names it in every
        error. ``version`` is the version the file name gives, used when the object has none;
        the other optional keys missing or null take their defaults."""
        if not isinstance(data, Mapping):
            raise cls.json_error(source, "not a JSON object")
        if data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{source}: checkpoint format {data.get('format_version')} is not supported "
                f"(this bigembed reads format {FORMAT_VERSION})"
            )
        config = data.get("config")
        relations = config.get("relations") if isinstance(config, dict) else None
        defaults: dict[str, Any] = {
            "iteration": {},
            "entity_counts": {},
            "num_relations": len(relations) if isinstance(relations, list) else 0,
            "relation_names": [],
            "time": 0.0,
            "bigembed_version": None,  # not the reader's
        }
        if version is not None:
            defaults["version"] = version
        given = {k: v for k, v in data.items() if v is not None or k not in defaults}
        return super().from_json({**defaults, **given}, source)

    def entity_types(self) -> list[str]:
        """The entity types with at least one partition count, in first-seen order."""
        return list(dict.fromkeys(t for t, _ in self.entity_counts))
