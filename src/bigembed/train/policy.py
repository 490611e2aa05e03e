"""Checkpoint policy: when and how the loop's steps become checkpoint versions.

Once the run has opened the checkpoint directory (``CheckpointStore.open_for_training``, or the
distributed agreement), a :class:`CheckpointPolicy` saves every step's state
(:meth:`~CheckpointPolicy.save_step`) and commits it with its stats
(:meth:`~CheckpointPolicy.commit_step`); a version is complete or absent (see
:mod:`bigembed.checkpoints.store`). :class:`LocalCheckpoints` is one machine's policy; the
distributed trainer's cooperative one is
:class:`bigembed.distributed.shared_checkpoint.CooperativeCheckpoints`.

:func:`resume` is the part both share: it checks that a committed checkpoint belongs to this
job and loads the model from it (or from ``init_path`` for a warm start).
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

from bigembed.checkpoints import (
    CheckpointMetadata,
    CheckpointStore,
    IterationPosition,
    check_same_import,
)
from bigembed.config import config_to_dict
from bigembed.errors import CheckpointError
from bigembed.train.iteration import Iteration
from bigembed.train.job import ModelState, TrainingJob
from bigembed.train.memory.partitions import PartitionSource, PartitionStore
from bigembed.train.records import StepLog, StepRecord

logger = logging.getLogger(__name__)


class CheckpointPolicy(Protocol):
    """How the loop's state reaches the checkpoint directory."""

    def save_step(self, it: Iteration, partitions: PartitionStore) -> None:
        """Write the state after step ``it`` (partitions, model, metadata) as ``it.version``;
        nothing is committed yet."""

    def commit_step(self, it: Iteration, log: StepLog) -> StepRecord:
        """Append the step's stats and make ``it.version`` the committed version; returns the
        step's record as committed (in a distributed run, merged over every trainer: what the
        summaries show, on every rank)."""


def checkpoint_metadata(job: TrainingJob, it: Iteration) -> CheckpointMetadata:
    """The metadata record of version ``it.version`` (read by resume, inference, conversion)."""
    cfg, entities = job.cfg, job.entities

    def featurized(t: str) -> bool:
        return t in cfg.entities and cfg.entities[t].featurized

    return CheckpointMetadata(
        version=it.version,
        config=config_to_dict(cfg),
        iteration=IterationPosition(
            epoch_idx=it.epoch,
            num_epochs=cfg.num_epochs,
            edge_path_idx=it.edge_path_idx,
            num_edge_paths=len(cfg.edge_paths),
            edge_path=cfg.edge_paths[it.edge_path_idx],
            edge_chunk_idx=it.chunk,
            num_edge_chunks=job.num_chunks,
        ),
        # rows of each stored table: a partition's entities, or the one feature table of a
        # featurized type (partition 0, shared by all its partitions; see docs/featurized.md)
        entity_counts={
            (t, p): entities.num_features(t) if featurized(t) else entities.count(t, p)
            for t in entities.entity_types
            for p in range(1 if featurized(t) else entities.num_partitions(t))
        },
        num_relations=job.num_relations,
        relation_names=list(entities.relation_names()),
        import_id=job.import_id,
    )


def resume(
    job: TrainingJob,
    state: ModelState,
    checkpoint: CheckpointStore,
    committed: int,
    *,
    grown: bool = False,
) -> PartitionSource | None:
    """Load the model of version ``committed`` (or warm-start from ``init_path``).

    Returns where partitions are first read from in a warm start (None otherwise). A
    checkpoint made with another chunking or another import of the graph is refused, unless
    ``grown``: its partitions were grown to the job's extended store
    (:func:`bigembed.train.growth.grow_checkpoint`).
    """
    cfg = job.cfg
    if committed > 0:
        meta = checkpoint.read_metadata(committed)
        made = meta.iteration.num_edge_chunks
        if made not in (None, job.num_chunks):
            raise CheckpointError(
                f"{checkpoint.path}: checkpoint was made with {made} edge chunks, "
                f"the config now gives {job.num_chunks}; set num_edge_chunks to match"
            )
        if not grown:
            extended = [e.import_id for e in job.entities.extends]
            check_same_import(
                checkpoint.path, meta.import_id, job.import_id, cfg.entity_path, extended
            )
        logger.info("resuming from checkpoint version %d of %d", committed, job.num_steps)
        state.restore(checkpoint.load_model(committed), checkpoint.path)
        return None
    if not cfg.init_path:
        return None
    init_store = CheckpointStore(cfg.init_path)
    init_version = init_store.committed_version()
    if init_version <= 0:
        raise CheckpointError(f"init_path {cfg.init_path}: no committed checkpoint there")
    init_meta = init_store.read_metadata(init_version)
    check_same_import(init_store.path, init_meta.import_id, job.import_id, cfg.entity_path)
    payload = init_store.load_model(init_version)
    payload["optimizer"] = None  # warm start: parameters yes, optimizer state no
    state.restore(payload, checkpoint.path)
    logger.info("warm start from %s", cfg.init_path)
    return PartitionSource(init_store, init_version)


def commit_with_stats(
    job: TrainingJob, checkpoint: CheckpointStore, it: Iteration, log: StepLog
) -> None:
    """Append ``log`` to the stats, write the config, commit ``it.version`` (and preserve the
    last version of every ``checkpoint_preservation_interval``-th epoch)."""
    cfg = job.cfg
    checkpoint.append_stats(log.to_json(), committed=it.index)
    checkpoint.write_config(json.dumps(config_to_dict(cfg), indent=1))
    preserve = cfg.checkpoint_preservation_interval
    last_of_epoch = it.edge_path_idx == len(cfg.edge_paths) - 1 and it.chunk == job.num_chunks - 1
    checkpoint.commit(it.version)
    if preserve and last_of_epoch and (it.epoch + 1) % preserve == 0:
        checkpoint.preserve(it.version, it.epoch + 1)


class LocalCheckpoints:
    """One machine's policy: every step is one checkpoint version, written by this process."""

    def __init__(self, job: TrainingJob, state: ModelState, checkpoint: CheckpointStore) -> None:
        self.job = job
        self.state = state
        self.checkpoint = checkpoint

    def save_step(self, it: Iteration, partitions: PartitionStore) -> None:
        partitions.flush()
        self.checkpoint.save_model(it.version, self.state.payload())
        self.checkpoint.write_metadata(checkpoint_metadata(self.job, it))

    def commit_step(self, it: Iteration, log: StepLog) -> StepRecord:
        commit_with_stats(self.job, self.checkpoint, it, log)
        return log.step
