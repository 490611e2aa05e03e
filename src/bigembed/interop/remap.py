"""Match a checkpoint's entity rows to another import of its entity path, by name.

A checkpoint's embedding rows are the entity offsets of the import it was trained on. After
the names changed (``import --force --allow-orphans`` over its entity store), this writes a new
checkpoint whose rows follow the new store: an entity of both imports keeps its embedding and
its row-Adagrad state, an entity only in the new import starts as a fresh model's would
(``init_scale``, seeded by (seed, type, partition)) with zero Adagrad state, and an entity only
in the old import is dropped (counted per type). Relation parameters, global embeddings and
their optimizer state are carried over unchanged; so are the version, the iteration position
and the stats, so training resumes from the remapped version.

The old names come from ``previous_imports/{import id}/`` in the entity path, where
``import --force --allow-orphans`` keeps them, or from any entity store of that import
(``--from-entities``). The output is a new directory, built under a temporary name and
published whole (:func:`bigembed.atomic.atomic_directory`); the source checkpoint is only read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bigembed.atomic import atomic_directory
from bigembed.checkpoints import CheckpointStore, TrainedModel, load_trained
from bigembed.errors import CheckpointError, InputError
from bigembed.output_paths import check_replaceable, refuse_overlap
from bigembed.partition_keys import PartitionKey
from bigembed.storage import (
    EntityStore,
    is_legacy_import_id,
    previous_import_path,
    record_dependent,
)
from bigembed.train import init_embeddings

SHOWN = 3  # dropped names shown per type


@dataclass
class TypeRemap:
    """What happened to the entities of one type."""

    kept: int = 0
    new: int = 0
    dropped: int = 0
    dropped_examples: list[str] = field(default_factory=list)

    def format(self) -> str:
        text = f"{self.kept:,} kept, {self.new:,} new"
        if self.dropped:
            shown = ", ".join(self.dropped_examples)
            more = ", ..." if self.dropped > len(self.dropped_examples) else ""
            text += f", {self.dropped:,} dropped (e.g. {shown}{more})"
        else:
            text += ", 0 dropped"
        return text


@dataclass
class RemapSummary:
    checkpoint: Path
    output: Path
    version: int
    entity_path: Path
    old_names: Path
    types: dict[str, TypeRemap]

    def format(self) -> str:
        lines = [
            f"Remapped version {self.version} of {self.checkpoint} to {self.output} "
            f"(entities matched by name to {self.entity_path}; old names from {self.old_names}):"
        ]
        lines += [f"  {etype}: {info.format()}" for etype, info in self.types.items()]
        lines.append(
            f"{self.checkpoint} is unchanged; query {self.output}, or train on with "
            f"-p checkpoint_path={self.output}"
        )
        return "\n".join(lines)


def default_output(checkpoint: str | os.PathLike[str]) -> Path:
    """Where ``bigembed remap`` writes by default: ``{checkpoint}-remapped`` beside it."""
    path = Path(os.path.abspath(checkpoint))
    return path.with_name(f"{path.name}-remapped")


def _old_store(trained: TrainedModel, new_path: Path, from_entities: str | None) -> EntityStore:
    """The entity store of the import the model was trained on."""
    recorded = trained.import_id
    if from_entities is None:
        if recorded is None:
            raise CheckpointError(
                f"{trained.path}: records no import id (it predates them); give "
                "--from-entities OLD_ENTITY_PATH (the data it was trained on, imported into "
                "another entity_path)"
            )
        kept = previous_import_path(new_path, recorded)
        if not (kept / "manifest.json").is_file():
            raise CheckpointError(
                f"{trained.path}: the names of the import it was trained on are not kept in "
                f"{kept} (`import --force` keeps them when it replaces a store a checkpoint "
                "depends on); give --from-entities OLD_ENTITY_PATH (the data it was trained on, "
                "imported into another entity_path)"
            )
        return EntityStore(kept)
    old = EntityStore(from_entities)
    if recorded is not None and not is_legacy_import_id(recorded) and old.import_id != recorded:
        raise InputError(
            f"{from_entities}: holds import {old.import_id}, but {trained.path} was trained on "
            f"import {recorded}; give an entity store of that import"
        )
    return old


def _check_shapes(trained: TrainedModel, old: EntityStore, new: EntityStore) -> None:
    """Same entity types (a missing one is an InputError naming the store) and partition counts
    as the model; the old store's counts equal its rows."""
    for etype in trained.config.entities:
        parts = trained.num_partitions(etype)
        for store in (old, new):
            if store.num_partitions(etype) != parts:
                raise InputError(
                    f"{store.path}: entity type {etype!r} has {store.num_partitions(etype)} "
                    f"partition(s) but the model has {parts}; remap keeps the partitioning "
                    "(import with the model's num_partitions)"
                )
        for part in range(parts):
            want = trained.entity_counts.get((etype, part))
            if want is not None and old.count(etype, part) != want:
                raise InputError(
                    f"{old.path}: entity type {etype!r} partition {part} has "
                    f"{old.count(etype, part)} names but {trained.path} has {want} rows: it is "
                    "not the import the model was trained on"
                )
    recorded = trained.metadata.relation_names
    if trained.config.dynamic_relations and recorded != new.relation_names():
        raise InputError(
            f"{new.path}: its relation types differ from the model's ({len(recorded)} recorded, "
            f"{new.num_relations} now); remap matches entities only: re-import with the same "
            "relation types"
        )


def _optimizer_rows(trained: TrainedModel, etype: str, part: int) -> np.ndarray | None:
    path = trained.store.optimizer_path(etype, part, trained.version)
    try:
        state = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        return None  # a converted checkpoint: Adagrad restarts at zero
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable optimizer state ({exc})") from None
    if state.shape != (trained.entity_counts.get((etype, part), len(state)),):
        raise CheckpointError(f"{path}: shape {state.shape} does not match its embeddings")
    return state


def _remap_type(
    trained: TrainedModel, old: EntityStore, new: EntityStore, etype: str
) -> tuple[TypeRemap, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """The new partitions of one type (embeddings, Adagrad state) and what was kept."""
    cfg = trained.config
    dim = cfg.entity_dimension(etype)
    info = TypeRemap()
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    old_parts = range(old.num_partitions(etype))
    for part in range(new.num_partitions(etype)):
        count = new.count(etype, part)
        emb = init_embeddings(count, dim, cfg.init_scale, cfg.seed, etype, part)
        state = torch.zeros(count)
        src_part, src_off = old.lookup(etype, new.names_array(etype, part))
        for q in old_parts:
            rows = np.flatnonzero(src_part == q)
            if len(rows) == 0:
                continue
            offsets = src_off[rows]
            at = torch.from_numpy(rows)
            emb[at] = torch.from_numpy(np.asarray(trained.mapped_embeddings(etype, q)[offsets]))
            old_state = _optimizer_rows(trained, etype, q)
            if old_state is not None:
                state[at] = torch.from_numpy(np.asarray(old_state[offsets], dtype=np.float32))
        info.kept += int((src_part >= 0).sum())
        info.new += int((src_part < 0).sum())
        out[part] = (emb, state)
    for q in old_parts:
        names = old.names_array(etype, q)
        found, _ = new.lookup(etype, names)
        gone = np.flatnonzero(found < 0)
        info.dropped += len(gone)
        room = SHOWN - len(info.dropped_examples)
        if room > 0 and len(gone):
            info.dropped_examples += [repr(n) for n in names.take(gone[:room]).to_pylist()]
    return info, out


def remap_checkpoint(
    checkpoint: str | os.PathLike[str],
    *,
    entity_path: str | None = None,
    from_entities: str | None = None,
    output: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> RemapSummary | None:
    """Write the committed version of ``checkpoint`` (a checkpoint directory, or its ``best/``
    snapshot) remapped to the entity store at ``entity_path`` (default: the one in its config)
    into ``output`` (default :func:`default_output`); None when the checkpoint already matches
    that store (nothing is written)."""
    trained = load_trained(checkpoint)
    featurized = [t for t in trained.config.entities if trained.is_featurized(t)]
    if featurized:  # their rows are features, not entities (docs/featurized.md)
        raise CheckpointError(
            f"{trained.path}: featurized entity types ({', '.join(featurized)}) cannot be "
            "remapped; train again on the new import"
        )
    new_path = Path(entity_path if entity_path is not None else trained.config.entity_path)
    new = EntityStore(new_path)
    if trained.import_id is not None and trained.import_id == new.import_id:
        return None
    out = Path(output) if output is not None else default_output(checkpoint)
    old = _old_store(trained, new_path, from_entities)
    refuse_overlap([out], [Path(checkpoint), old.path, new.path])
    check_replaceable(out, "checkpoint", force=force)
    _check_shapes(trained, old, new)

    types: dict[str, TypeRemap] = {}
    partitions: dict[PartitionKey, tuple[torch.Tensor, torch.Tensor]] = {}
    for etype in trained.config.entities:
        types[etype], parts = _remap_type(trained, old, new, etype)
        partitions.update({(etype, p): v for p, v in parts.items()})
    payload = trained.store.load_model(trained.version)
    meta = trained.metadata
    config = dict(meta.config)
    config["checkpoint_path"] = str(Path(os.path.abspath(out)))
    if entity_path is not None:
        config["entity_path"] = str(entity_path)
    record = dataclasses.replace(
        meta,
        config=config,
        entity_counts={key: len(emb) for key, (emb, _) in partitions.items()},
        import_id=new.import_id,
        converted_from={
            "system": "bigembed remap",
            "checkpoint": str(Path(os.path.abspath(trained.path))),
            "import_id": meta.import_id,
        },
        time=time.time(),
    )
    with atomic_directory(out, force=force, marker="checkpoint") as tmp:
        written = CheckpointStore(tmp)
        for (etype, part), (emb, state) in partitions.items():
            written.save_partition(etype, part, trained.version, emb, state)
        written.save_model(trained.version, payload)
        written.write_metadata(record)
        written.write_config(json.dumps(config, indent=1))
        written.append_stats(trained.store.read_stats(trained.version), committed=0)
        written.commit(trained.version)
    record_dependent(new_path, out)
    return RemapSummary(Path(checkpoint), out, trained.version, new_path, old.path, types)
