"""What a training run works on: the checked graph, its partitions and chunks, and the model.

:class:`TrainingJob` opens the imported graph and checks it against the config
(:func:`check_graph`) and says how many edge chunks a step has and which partitions exist
(bucket geometry itself is :mod:`bigembed.buckets.geometry`). :class:`ModelState` is the scoring
model with its Adagrad state, as saved in and restored from checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bigembed.checkpoints import check_checkpoint_fits, state_mismatch
from bigembed.config import ConfigSchema, model_spec, relation_list
from bigembed.errors import CheckpointError, ConfigError
from bigembed.model import FeatureBags, ScoringModel
from bigembed.partition_keys import PartitionKey
from bigembed.storage import EdgeStore, EntityStore, check_edges_import, check_edges_relations


def _shown(names: list[str]) -> str:
    return f"[{', '.join(names)}]"


def check_entity_types(cfg: ConfigSchema, entities: EntityStore) -> None:
    """Refuse a config whose relations use entity types the import does not have, naming the
    types on both sides (and the relations, when those differ as well: a config written for
    another graph usually changes both)."""
    used = sorted({t for r in cfg.relations for t in (r.lhs, r.rhs)})
    have = sorted(entities.entity_types)
    missing = [t for t in used if t not in have]
    if not missing:
        return
    relations = relation_list(cfg)
    imported = None if entities.dynamic_relations else entities.relation_names()
    also = ""
    if relations != imported:
        mine = "dynamic" if relations is None else _shown(relations)
        theirs = "dynamic" if imported is None else _shown(imported)
        also = f"; its relations differ too (config {mine}, import {theirs})"
    raise ConfigError(
        f"entities: the config's relations use entity types {_shown(used)} but the graph at "
        f"{cfg.entity_path} was imported with {_shown(have)} (missing: {', '.join(missing)})"
        f"{also}; re-run bigembed import with this config (or restore the config's entities)"
    )


def check_graph(cfg: ConfigSchema, entities: EntityStore, edge_stores: list[EdgeStore]) -> None:
    """Refuse a graph that is not the one the config describes (one line naming the key)."""
    check_edges_import(entities, *edge_stores)
    check_entity_types(cfg, entities)
    check_edges_relations(relation_list(cfg), *edge_stores)
    for etype in {t for r in cfg.relations for t in (r.lhs, r.rhs)}:
        want = cfg.entities[etype].num_partitions
        have = entities.num_partitions(etype)
        if want != have:
            raise ConfigError(
                f"entities.{etype}.num_partitions: config says {want} but the graph at "
                f"{cfg.entity_path} was imported with {have}; re-run bigembed import"
            )
        if cfg.entities[etype].featurized and not entities.is_featurized(etype):
            raise ConfigError(
                f"entities.{etype}.featurized: true but the graph at {cfg.entity_path} was "
                f"imported without its features; re-run bigembed import --features {etype}=FILE"
            )
    if cfg.dynamic_relations and entities.num_relations <= 0:
        raise ConfigError(f"{cfg.entity_path}: no relation types found for dynamic relations")


class TrainingJob:
    """The config and the imported graph it trains on, checked against each other."""

    def __init__(self, cfg: ConfigSchema) -> None:
        check_checkpoint_fits(cfg)  # first: a checkpoint of another model is refused in one line
        self.cfg = cfg
        self.entities = EntityStore(cfg.entity_path)
        self.edge_stores = [EdgeStore(p) for p in cfg.edge_paths]
        check_graph(cfg, self.entities, self.edge_stores)
        self.num_chunks = self._num_chunks()
        self.num_relations = (
            self.entities.num_relations if cfg.dynamic_relations else len(cfg.relations)
        )

    @property
    def import_id(self) -> str | None:
        """Which import of the entity path this run trains on (None: imported before ids)."""
        return self.entities.import_id

    @property
    def num_steps(self) -> int:
        return self.cfg.num_epochs * len(self.cfg.edge_paths) * self.num_chunks

    def _num_chunks(self) -> int:
        if self.cfg.num_edge_chunks is not None:
            return self.cfg.num_edge_chunks
        biggest = max(
            (s.num_edges(i, j) for s in self.edge_stores for (i, j) in s.buckets()), default=0
        )
        return max(1, math.ceil(biggest / self.cfg.max_edges_per_chunk))

    # ------------------------------------------------------------------ partitions
    def partition_counts(self) -> dict[PartitionKey, int]:
        """Rows of each stored table: a partition's entities, or a featurized type's features.

        A featurized type has one feature table, whatever its partitions: stored as partition
        0, shared by all its partitions (each holds only its bags; :meth:`table_key`)."""
        types = [t for t in self.entities.entity_types if t in self.cfg.entities]
        featurized = {t for t in types if self.cfg.entities[t].featurized}
        return {
            (t, p): self.entities.num_features(t) if t in featurized else self.entities.count(t, p)
            for t in types
            for p in range(1 if t in featurized else self.entities.num_partitions(t))
        }

    def table_key(self, key: PartitionKey) -> PartitionKey:
        """The stored table partition ``key`` uses: its own, or its featurized type's one
        feature table (partition 0)."""
        return (key[0], 0) if self.cfg.entities[key[0]].featurized else key

    def feature_bags(self, shared: bool) -> dict[PartitionKey, FeatureBags]:
        """The bags of every featurized partition (in shared memory for Hogwild workers)."""
        out = {}
        for t, schema in self.cfg.entities.items():
            if not schema.featurized:
                continue
            for p in range(self.entities.num_partitions(t)):
                csr = self.entities.features(t, p)
                bags = FeatureBags.from_arrays(csr.offsets, csr.features, csr.weights)
                out[(t, p)] = bags.share_memory_() if shared else bags
        return out

    def dimensions(self) -> dict[str, int]:
        return {t: self.cfg.entity_dimension(t) for t in self.cfg.entities}

    def unpartitioned(self, counts: dict[PartitionKey, int]) -> list[PartitionKey]:
        """The tables every bucket may need, resident for the whole run: those of the
        unpartitioned types and the feature tables of the featurized types (features are not
        partitioned: every partition of the type uses them)."""
        return [
            (t, 0)
            for t, e in self.cfg.entities.items()
            if (e.num_partitions == 1 or e.featurized) and (t, 0) in counts
        ]


@dataclass
class ModelState:
    """The scoring model (relation operators, global embeddings) and its Adagrad state."""

    model: ScoringModel
    adagrad: list[Tensor]

    @classmethod
    def build(cls, job: TrainingJob) -> ModelState:
        cfg = job.cfg
        model = ScoringModel(model_spec(cfg, job.num_relations))
        return cls(model, [torch.zeros_like(p) for p in model.parameters()])

    def move_to_shared_memory(self) -> None:
        """For Hogwild workers (and the parameter sharer): do it before anyone holds views,
        ``share_memory_`` moves the storage."""
        self.model.share_memory()
        for s in self.adagrad:
            s.share_memory_()

    def payload(self) -> dict[str, Any]:
        """A copy to save in a checkpoint."""
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": [s.clone() for s in self.adagrad],
        }

    def restore(self, payload: dict[str, Any], source: object) -> None:
        """Load a checkpoint's payload; ``"optimizer": None`` keeps the Adagrad state at zero."""
        mismatch = state_mismatch(self.model, payload["model"])
        if mismatch is not None:
            raise CheckpointError(f"{source}: model parameters do not fit this config: {mismatch}")
        self.model.load_state_dict(payload["model"])
        if payload.get("optimizer"):
            for state, saved in zip(self.adagrad, payload["optimizer"], strict=True):
                state.copy_(saved)
