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

from bigembed.config import ConfigSchema, parse_config_dict
from bigembed.errors import CheckpointError
from bigembed.model.scoring import ScoringModel
from bigembed.train.checkpoint import CheckpointStore


@dataclass
class TrainedModel:
    path: Path
    version: int
    config: ConfigSchema
    model: ScoringModel
    entity_counts: dict[tuple[str, int], int]
    relation_names: list[str]

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
    """Open the last committed version of a checkpoint directory."""
    store = CheckpointStore(path)
    if not store.path.is_dir():
        raise CheckpointError(f"{store.path}: no such checkpoint directory")
    version = store.committed_version()
    if version <= 0:
        raise CheckpointError(
            f"{store.path}: no complete checkpoint (checkpoint_version.txt missing)"
        )
    meta = store.load_metadata(version)
    config = parse_config_dict(meta["config"], source=str(store.metadata_path(version)))
    num_rel = int(meta.get("num_relations", len(config.relations)))
    model = ScoringModel(config, num_rel if config.dynamic_relations else 0)
    payload = store.load_model(version)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise CheckpointError(
            f"{store.model_path(version)}: does not fit its config: {exc}"
        ) from None
    model.eval()
    counts = {}
    for key, count in meta.get("entity_counts", {}).items():
        etype, _, part = key.rpartition("_")
        counts[(etype, int(part))] = int(count)
    for etype, part in counts:
        if etype in config.entities and not store.has_partition(etype, part, version):
            raise CheckpointError(
                f"{store.embeddings_path(etype, part, version)}: missing (incomplete checkpoint?)"
            )
    return TrainedModel(
        store.path, version, config, model, counts, list(meta.get("relation_names", []))
    )
