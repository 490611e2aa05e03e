"""A trained model read back from a checkpoint directory: config, parameters, embeddings.

Embeddings are memory-mapped from the checkpoint, so opening a model over billions of entities
costs nothing until rows are used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from bigembed.checkpoints.store import CheckpointStore, check_same_import, npy_header
from bigembed.config import ConfigSchema, parse_config_dict
from bigembed.errors import CheckpointError
from bigembed.model.scoring import ScoringModel
from bigembed.storage.entities import EntityStore


@dataclass
class TrainedModel:
    path: Path
    version: int
    config: ConfigSchema
    model: ScoringModel
    entity_counts: dict[tuple[str, int], int]
    relation_names: list[str]
    import_id: str | None = None  # which import of the entity path it was trained on

    def check_import(self, entities: EntityStore) -> None:
        """Refuse an entity store from another import than the one this model was trained on."""
        check_same_import(self.path, self.import_id, entities.import_id, entities.path)

    @property
    def store(self) -> CheckpointStore:
        return CheckpointStore(self.path)

    def num_partitions(self, entity_type: str) -> int:
        return self.config.entities[entity_type].num_partitions

    def embeddings(self, entity_type: str, part: int) -> torch.Tensor:
        """Stored embeddings of one partition (memory-mapped; without the global embedding)."""
        path = self.store.embeddings_path(entity_type, part, self.version)
        if not path.exists():
            raise CheckpointError(f"{path}: missing (incomplete checkpoint?)")
        # copy-on-write map: nothing is read until used, and writes never reach the file
        array = np.load(path, mmap_mode="c", allow_pickle=False)
        return torch.from_numpy(array)

    @cached_property
    def partition_bases(self) -> dict[str, np.ndarray]:
        """Per entity type, the global index of each partition's first entity."""
        out = {}
        for etype in self.config.entities:
            counts = [
                self.entity_counts.get((etype, p), 0) for p in range(self.num_partitions(etype))
            ]
            out[etype] = np.concatenate(([0], np.cumsum(counts)))
        return out


def load_trained(path: str | os.PathLike[str]) -> TrainedModel:
    """Open the last committed version of a checkpoint directory.

    The metadata is checked against the files it describes before anything is allocated: each
    partition's ``.npy`` header must give ``(entity count, dimension)``, and every model
    parameter's shape (computed on the meta device, which allocates nothing) must match the
    model file's. A metadata file claiming a huge dimension or count is refused with one line
    naming it instead of trying to allocate terabytes.
    """
    store = CheckpointStore(path)
    version = store.require_committed()
    meta = store.load_metadata(version)
    meta_path = store.metadata_path(version)
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f"{meta_path}: corrupt metadata (no 'config' object)")
    config = parse_config_dict(meta["config"], source=str(meta_path))
    try:
        num_rel = int(meta.get("num_relations", len(config.relations)))
        counts = {}
        for key, count in dict(meta.get("entity_counts", {})).items():
            etype, _, part_text = str(key).rpartition("_")
            counts[(etype, int(part_text))] = int(count)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{meta_path}: corrupt metadata ({exc})") from None
    if num_rel < 0 or any(c < 0 for c in counts.values()):
        raise CheckpointError(f"{meta_path}: corrupt metadata (negative count)")
    for (etype, part), count in counts.items():
        if etype in config.entities:
            epath = store.embeddings_path(etype, part, version)
            shape, _dtype = npy_header(epath)
            want = (count, config.entity_dimension(etype))
            if shape != want:
                raise CheckpointError(
                    f"{meta_path}: says partition {part} of '{etype}' is {want} (entities, "
                    f"dimension) but {epath.name} holds {shape}"
                )
    payload = store.load_model(version, mmap=True)
    dynamic = num_rel if config.dynamic_relations else 0
    with torch.device("meta"):
        skeleton = ScoringModel(config, dynamic)
    _check_shapes(skeleton, payload["model"], meta_path, store.model_path(version))
    model = ScoringModel(config, dynamic)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise CheckpointError(
            f"{store.model_path(version)}: does not fit its config: {exc}"
        ) from None
    model.eval()
    recorded = meta.get("import_id")
    return TrainedModel(
        store.path,
        version,
        config,
        model,
        counts,
        list(meta.get("relation_names", [])),
        recorded if isinstance(recorded, str) else None,
    )


def _check_shapes(
    skeleton: torch.nn.Module, saved: dict[str, object], meta_path: Path, model_path: Path
) -> None:
    """The config's parameter shapes (``skeleton`` lives on the meta device) against the file."""
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    for key, shape in want.items():
        tensor = saved.get(key)
        have = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        if have != shape:
            raise CheckpointError(
                f"{meta_path}: its config gives parameter {key!r} the shape {shape} but "
                f"{model_path.name} holds {have}"
            )
