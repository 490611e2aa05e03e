"""Does a checkpoint fit the config that is about to train it? Asked first, answered in one line.

A checkpoint's metadata records the full config of the run that wrote it
(:class:`~bigembed.checkpoints.metadata.CheckpointMetadata` ``config``).
:func:`check_checkpoint_fits` compares that record with the config of a run about to resume it
(or warm-start from ``init_path``) before anything is opened or written:

* the keys that **shape the saved model** (:data:`MODEL_KEYS`, :data:`ENTITY_KEYS`,
  :data:`RELATION_KEYS`, the entity types and the number of relations) must be equal: tensors
  of another shape, or parameters that would mean something else (another comparator, a
  relation between other types). A difference is a :class:`ModelMismatchError` naming every
  such key with its recorded and new value and the ways out (another ``checkpoint_path``, or
  ``bigembed train --fresh``);
* every other key only changes how training goes on (``lr``, negatives, ``num_epochs``...):
  accepted, and the changes are logged in one line.

A record written before a key existed is compared on the keys it has. Whatever gets past the
comparison and still does not fit (a damaged file, a record edited by hand) is described by
:func:`state_mismatch` in one line instead of torch's multi-line ``load_state_dict`` dump.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bigembed.checkpoints.store import CheckpointStore
from bigembed.config import ConfigSchema, config_to_dict
from bigembed.errors import CheckpointError

logger = logging.getLogger(__name__)

#: Top-level keys that shape the saved model: tensor shapes, or what the parameters mean.
MODEL_KEYS = ("dimension", "dynamic_relations", "global_emb", "comparator", "bias")
#: Keys of each ``entities.TYPE`` that shape its embedding tables.
ENTITY_KEYS = ("num_partitions", "dimension", "featurized")
#: Keys of each ``relations.N`` that shape (or give meaning to) its operator's parameters.
RELATION_KEYS = ("name", "lhs", "rhs", "operator")
#: The model-shaping keys whose difference only changes what parameters mean, not their shapes:
#: a warm start (``init_path``) from such a model is allowed, with a warning.
MEANING_ONLY = ("comparator", "bias", "name", "lhs", "rhs")
#: Keys never reported as changes: where the checkpoint is (the same directory, maybe spelt
#: differently) and the search space of ``bigembed tune`` (ignored by training).
NOT_COMPARED = ("checkpoint_path", "tune")
#: How many changes a message names before "(and N more)".
SHOWN = 4


@dataclass(frozen=True)
class Change:
    """One key whose recorded value differs from the config's."""

    key: str  # as ``-p`` takes it: ``entities.user.num_partitions``, ``relations.0.operator``
    old: Any
    new: Any

    @property
    def meaning_only(self) -> bool:
        return self.key.rsplit(".", 1)[-1] in MEANING_ONLY

    def text(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 40 else text[:37] + "..."


def describe(changes: list[Change]) -> str:
    """``a 1 -> 2, b x -> y`` for the first few changes, then ``(and N more)``."""
    shown = ", ".join(c.text() for c in changes[:SHOWN])
    more = len(changes) - SHOWN
    return shown + (f" (and {more} more)" if more > 0 else "")


class ModelMismatchError(CheckpointError):
    """The checkpoint holds a model of another shape than the config asks for.

    ``changes`` are the differing keys; ``remedy`` the ways out the message offers (a command
    with other options, such as ``bigembed demo``, builds its own with :meth:`with_remedy`).
    """

    def __init__(self, path: str, changes: list[Change], remedy: str, what: str) -> None:
        self.path = path
        self.changes = changes
        self.what = what
        super().__init__(f"{path}: {what} {describe(changes)}; {remedy}")

    def with_remedy(self, remedy: str) -> ModelMismatchError:
        return ModelMismatchError(self.path, self.changes, remedy, self.what)


def resume_remedy(path: str, *, distributed: bool = False) -> str:
    """The ways out of a mismatch (``bigembed train --fresh`` is for one machine only)."""
    fresh = "" if distributed else f", or pass --fresh to start over in {path} (deleting it)"
    return (
        f"to train this config, set another checkpoint_path{fresh}; to keep training the "
        "checkpoint, change the values back"
    )


# ---------------------------------------------------------------------- comparing records
def _common(old: Any, new: Any, key: str, names: tuple[str, ...]) -> Iterator[Change]:
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return
    for name in names:
        if name in old and name in new and old[name] != new[name]:
            yield Change(f"{key}{name}", old[name], new[name])


def model_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """The model-shaping keys whose values differ; keys the record lacks are not compared."""
    changes = list(_common(recorded, current, "", MODEL_KEYS))
    old_types, new_types = recorded.get("entities"), current.get("entities")
    if isinstance(old_types, Mapping) and isinstance(new_types, Mapping):
        if set(old_types) != set(new_types):
            changes.append(Change("entities", sorted(old_types), sorted(new_types)))
        for etype in (t for t in new_types if t in old_types):
            key = f"entities.{etype}."
            changes += _common(old_types[etype], new_types[etype], key, ENTITY_KEYS)
    old_rels, new_rels = recorded.get("relations"), current.get("relations")
    if isinstance(old_rels, list) and isinstance(new_rels, list):
        if len(old_rels) != len(new_rels):
            changes.append(Change("relations", _names(old_rels), _names(new_rels)))
        for i, (old, new) in enumerate(zip(old_rels, new_rels, strict=False)):
            changes += _common(old, new, f"relations.{i}.", RELATION_KEYS)
    return changes


def _names(relations: list[Any]) -> list[Any]:
    return [r.get("name") if isinstance(r, Mapping) else r for r in relations]


def _leaves(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(data, Mapping) and data:
        for k, v in data.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        for i, v in enumerate(data):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), data


def _shapes_model(key: str) -> bool:
    parts = key.split(".")
    if parts[0] in MODEL_KEYS:
        return True
    if parts[0] == "entities":
        return len(parts) < 3 or parts[2] in ENTITY_KEYS
    if parts[0] == "relations":
        return len(parts) < 3 or parts[2] in RELATION_KEYS
    return False


def training_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """Every other key whose value differs (keys the record lacks are not compared)."""
    old = dict(_leaves(recorded))
    return [
        Change(key, old[key], value)
        for key, value in _leaves(current)
        if key in old
        and old[key] != value
        and not _shapes_model(key)
        and key.split(".", 1)[0] not in NOT_COMPARED
    ]


# ---------------------------------------------------------------------- the check
def _recorded_config(store: CheckpointStore, version: int) -> dict[str, Any] | None:
    """The config recorded with ``version``; None when it cannot be read (the writer's protocol
    or the reader then reports what is wrong with the checkpoint, as it always has)."""
    try:
        return store.read_metadata(version).config
    except CheckpointError:
        return None


def check_checkpoint_fits(cfg: ConfigSchema) -> None:
    """Compare ``cfg`` with the record of the checkpoint it resumes (or warm-starts from).

    Raises :class:`ModelMismatchError` when a model-shaping key differs; logs the keys that
    only change training. Nothing is written. A directory without a committed version (or
    whose version cannot be read: the writer's protocol reports that) passes.
    """
    current = config_to_dict(cfg)
    store = CheckpointStore(cfg.checkpoint_path)
    try:
        committed = store.committed_version() if store.path.is_dir() else 0
    except CheckpointError:
        committed = 0
    if committed > 0:
        recorded = _recorded_config(store, committed)
        if recorded is None:
            return
        changes = model_changes(recorded, current)
        if changes:
            raise ModelMismatchError(
                cfg.checkpoint_path,
                changes,
                resume_remedy(cfg.checkpoint_path, distributed=cfg.num_machines > 1),
                "holds a model trained with other model-shaping values (checkpoint -> config):",
            )
        changed = training_changes(recorded, current)
        if changed:
            logger.info(
                "resuming %s with changed training settings (checkpoint -> config): %s",
                cfg.checkpoint_path,
                ", ".join(c.text() for c in changed),
            )
        return
    if cfg.init_path:
        _check_warm_start(cfg, current)


def _check_warm_start(cfg: ConfigSchema, current: dict[str, Any]) -> None:
    assert cfg.init_path is not None
    init = CheckpointStore(cfg.init_path)
    try:
        version = init.committed_version() if init.path.is_dir() else 0
    except CheckpointError:
        return
    recorded = _recorded_config(init, version) if version > 0 else None
    if recorded is None:
        return
    changes = model_changes(recorded, current)
    shapes = [c for c in changes if not c.meaning_only]
    if shapes:
        raise ModelMismatchError(
            f"init_path {cfg.init_path}",
            shapes,
            "set init_path to a checkpoint of this config's shape, or change the values to "
            "the checkpoint's",
            "holds a model of another shape (init_path -> config):",
        )
    if changes:
        logger.warning(
            "warm start from %s, a model trained with other values (init_path -> config): %s",
            cfg.init_path,
            describe(changes),
        )


# ---------------------------------------------------------------------- parameters
def state_mismatch(model: torch.nn.Module, saved: Mapping[str, Any]) -> str | None:
    """How ``saved`` does not fit ``model``'s parameters, in one line; None when it fits.

    Shapes are compared first (the common case: another dimension or operator), then missing
    and unexpected names; at most the first of each kind is named, with a count.
    """
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = []
    for key, shape in want.items():
        tensor = saved.get(key)
        if isinstance(tensor, torch.Tensor) and tuple(tensor.shape) != shape:
            shapes.append(f"{key!r} is {tuple(tensor.shape)} in the file, {shape} in the config")
    missing = [k for k in want if k not in saved]
    unexpected = [k for k in saved if k not in want]
    parts = []
    if shapes:
        parts.append(f"parameter {shapes[0]}" + _more(shapes))
    if missing:
        parts.append(f"parameter {missing[0]!r} missing from the file" + _more(missing))
    if unexpected:
        parts.append(f"parameter {unexpected[0]!r} not in the config's model" + _more(unexpected))
    return "; ".join(parts) if parts else None


def _more(items: list[str]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""
