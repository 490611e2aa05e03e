"""Continuing a model on an extended entity store: its partitions grown, its old rows frozen.

``bigembed import --extend`` appends new entities to every partition and records the import
it extended (:class:`bigembed.storage.Extension`). A checkpoint trained on that import is then
a prefix of the store: row ``k`` of a partition still means the same entity. When training
resumes such a checkpoint, :func:`grow_checkpoint` writes every partition of the working
version (the one the next step commits) at the new size before the loop starts: the old rows
and their row-Adagrad state bit for bit, the new rows initialised as ``growth.init`` says
(``random``: a fresh model's rows, ``init_scale`` seeded by (seed, type, partition), as
``bigembed remap`` gives new entities; ``neighbors``: the mean of the embeddings of their old
neighbours over the training edges, ignoring relations and weights, random when they have
none), with a zero row-Adagrad state (``growth.init_state: zero``) or the mean state of the
partition's old rows (``old_mean``: a zero state makes a new row's first steps the largest of
any row's). The partition store then reads the working version first, so
nothing else changes; the next committed version is the grown model, trained one more step.

``growth.freeze`` keeps parts of the model unchanged while training goes on:
:func:`frozen_rows` gives, per partition, how many leading rows (the entities of the store this
one extends) the optimizer step must never change; ``relations`` freezes the model's dense
parameters (relation operators, global embeddings). The batch kernel enforces both
(:class:`bigembed.kernels.BatchTrainer`).

``growth.edges: new`` makes an epoch cost a fraction of one: :func:`new_edges` gives the
training loop a :class:`NewEdges` that cuts each bucket's training edges to those touching a new
entity, plus a fresh ``growth.replay_fraction`` sample of the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from bigembed.checkpoints import CheckpointMetadata, CheckpointStore
from bigembed.config import ConfigSchema
from bigembed.errors import CheckpointError, ConfigError
from bigembed.partition_keys import BucketSides, PartitionKey
from bigembed.storage import EntityStore, Extension
from bigembed.train.job import TrainingJob
from bigembed.train.memory.partition_values import init_embeddings

logger = logging.getLogger(__name__)

#: The kernel choice's reason when growth.freeze is set (the eager step masks the updates).
FROZEN_REASON = "growth.freeze: the eager step leaves the frozen rows and parameters unchanged"


@dataclass
class Growth:
    """What :func:`grow_checkpoint` did: the import grown from and the new rows per type."""

    from_import: str
    init: str
    new_rows: dict[str, int] = field(default_factory=dict)
    seeded_by_neighbours: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        rows = ", ".join(f"{t}: {n:,} new" for t, n in self.new_rows.items())
        text = f"grew the model from import {self.from_import} to the extended store ({rows}); "
        if self.init == "neighbors":
            seeded = sum(self.seeded_by_neighbours.values())
            return text + f"{seeded:,} new rows start at their neighbours' mean, the rest random"
        return text + "new rows start random"


def pending_extension(entities: EntityStore, meta: CheckpointMetadata) -> Extension | None:
    """The store's record of the import ``meta`` was trained on, when the store extends it
    (None when it is the same import, or not a prefix of it)."""
    if meta.import_id is None or meta.import_id == entities.import_id:
        return None
    return entities.extension_of(meta.import_id)


def _check_counts(checkpoint: CheckpointStore, meta: CheckpointMetadata, ext: Extension) -> None:
    for (etype, part), rows in meta.entity_counts.items():
        old = ext.counts.get(etype)
        if old is None or part >= len(old) or old[part] != rows:
            raise CheckpointError(
                f"{checkpoint.path}: partition {part} of {etype!r} has {rows} rows but the "
                f"import {ext.import_id} it was trained on has "
                f"{'none' if old is None or part >= len(old) else old[part]}; the checkpoint "
                "does not match the store's record of it"
            )


def _neighbour_sums(
    job: TrainingJob, checkpoint: CheckpointStore, version: int, ext: Extension
) -> dict[PartitionKey, tuple[torch.Tensor, torch.Tensor]]:
    """Per partition, the sum of the old neighbours' embeddings of each new row and their
    number, over every edge of the training edge paths (both directions)."""
    cfg = job.cfg
    counts = job.partition_counts()
    dims = job.dimensions()
    sums = {
        key: (torch.zeros((n - ext.counts[key[0]][key[1]], dims[key[0]])), torch.zeros(n))
        for key, n in counts.items()
    }
    tables: dict[PartitionKey, np.ndarray] = {}

    def old_rows(key: PartitionKey) -> np.ndarray:
        if key not in tables:
            path = checkpoint.embeddings_path(key[0], key[1], version)
            tables[key] = np.load(path, mmap_mode="r", allow_pickle=False)
        return tables[key]

    def add(to: PartitionKey, rows: np.ndarray, frm: PartitionKey, others: np.ndarray) -> None:
        new = rows >= ext.counts[to[0]][to[1]]
        old = others < ext.counts[frm[0]][frm[1]]
        pick = np.flatnonzero(new & old)
        if len(pick) == 0:
            return
        at = torch.from_numpy(rows[pick].astype(np.int64) - ext.counts[to[0]][to[1]])
        values = torch.from_numpy(np.asarray(old_rows(frm)[others[pick]], dtype=np.float32))
        total, number = sums[to]
        total.index_add_(0, at, values)
        number.index_add_(0, at, torch.ones(len(pick)))

    for store in job.edge_stores:
        for i, j in store.buckets():
            chunk = store.load_bucket(i, j)
            lhs, rhs, rel = np.asarray(chunk.lhs), np.asarray(chunk.rhs), np.asarray(chunk.rel)
            relations = [0] if cfg.dynamic_relations else range(len(cfg.relations))
            for r in relations:
                mask = slice(None) if cfg.dynamic_relations else rel == r
                left = (cfg.relations[r].lhs, i)
                right = (cfg.relations[r].rhs, j)
                add(left, lhs[mask], right, rhs[mask])
                add(right, rhs[mask], left, lhs[mask])
    return sums


def grow_checkpoint(job: TrainingJob, checkpoint: CheckpointStore, committed: int) -> Growth | None:
    """Write every partition of version ``committed + 1`` grown to the job's extended store
    (see the module docstring); None, writing nothing, when the committed version was trained
    on the store's own import (or on one it does not extend: the import check reports that)."""
    if committed <= 0:
        return None
    meta = checkpoint.read_metadata(committed)
    ext = pending_extension(job.entities, meta)
    if ext is None:
        return None
    _check_counts(checkpoint, meta, ext)
    cfg = job.cfg
    growth = Growth(ext.import_id, cfg.growth.init)
    sums = (
        _neighbour_sums(job, checkpoint, committed, ext) if cfg.growth.init == "neighbors" else {}
    )
    dims = job.dimensions()
    for (etype, part), count in sorted(job.partition_counts().items()):
        old, dim = ext.counts[etype][part], dims[etype]
        emb = init_embeddings(count, dim, cfg.init_scale, cfg.seed, etype, part)
        state = torch.zeros(count)
        checkpoint.check_partition(etype, part, committed, old, dim)
        checkpoint.load_partition(
            etype, part, committed, emb[:old], state[:old], require_state=True
        )
        if cfg.growth.init_state == "old_mean" and old > 0:
            state[old:] = state[:old].mean()
        if (etype, part) in sums:
            total, number = sums[(etype, part)]
            seen = torch.nonzero(number > 0).flatten()
            emb[old + seen] = total[seen] / number[seen].unsqueeze(1)
            growth.seeded_by_neighbours[etype] = growth.seeded_by_neighbours.get(etype, 0) + len(
                seen
            )
        growth.new_rows[etype] = growth.new_rows.get(etype, 0) + count - old
        checkpoint.save_partition(etype, part, committed + 1, emb, state)
    logger.info("%s", growth.describe())
    return growth


def _last_extension_rows(
    cfg: ConfigSchema, entities: EntityStore, setting: str, fix: str
) -> dict[PartitionKey, int]:
    """Per partition, the rows of the entities of the import the store last extended; refused,
    naming ``setting`` and its ``fix``, when the store extends nothing (every entity is old)."""
    if not entities.extends:
        raise ConfigError(
            f"{setting}, but {entities.path} extends no import (it was not made by `bigembed "
            f"import --extend`), so every entity is old; {fix}"
        )
    last = entities.extends[-1]
    return {
        (etype, part): rows
        for etype, counts in last.counts.items()
        if etype in cfg.entities
        for part, rows in enumerate(counts)
    }


def frozen_rows(cfg: ConfigSchema, entities: EntityStore) -> dict[PartitionKey, int]:
    """Per partition, how many leading rows training must leave unchanged: with
    ``growth.freeze: [old_entities]``, the entities of the import the store last extended."""
    if "old_entities" not in cfg.growth.freeze:
        return {}
    return _last_extension_rows(
        cfg,
        entities,
        "growth.freeze: old_entities",
        "nothing would train: remove old_entities from growth.freeze",
    )


@dataclass(frozen=True)
class NewEdges:
    """``growth.edges: new``: a bucket's training edges cut to those touching a new entity (a
    row at or past its partition's ``old_rows``, the entities of the import the store last
    extended) plus a fresh ``replay`` share of the others every epoch. An update then costs a
    fraction of an epoch; the replayed edges keep the old rows on their own edges and, with the
    new entities among their negatives, keep the new rows from outscoring old answers."""

    old_rows: dict[PartitionKey, int]
    replay: float

    def pick(
        self,
        sides: BucketSides,
        lhs: torch.Tensor,
        rhs: torch.Tensor,
        rel: torch.Tensor,
        seed: int,
    ) -> torch.Tensor:
        """Indices (ascending) of the edges to train among ``lhs``, ``rhs``, ``rel`` (one
        bucket's, whose sides are ``sides``: per relation, or one entry for dynamic relations);
        the replay sample is drawn from ``seed``."""
        which = rel if len(sides) > 1 else torch.zeros_like(rel)
        lhs_old = torch.tensor([self.old_rows.get(left, 0) for left, _ in sides])
        rhs_old = torch.tensor([self.old_rows.get(right, 0) for _, right in sides])
        keep = (lhs >= lhs_old[which]) | (rhs >= rhs_old[which])
        if self.replay > 0:
            draw = torch.rand(len(lhs), generator=torch.Generator().manual_seed(seed))
            keep |= draw < self.replay
        return torch.nonzero(keep).flatten()


def new_edges(job: TrainingJob) -> NewEdges | None:
    """The edge selection of ``growth.edges: new`` (None with ``all``: every edge trains)."""
    cfg = job.cfg
    if cfg.growth.edges == "all":
        return None
    entities = job.entities
    rows = _last_extension_rows(
        cfg, entities, "growth.edges: new", "only the replay would train: set growth.edges: all"
    )
    fresh = sum(entities.total(t) for t in {t for t, _ in rows}) - sum(rows.values())
    logger.info(
        "growth.edges: new: each epoch trains the edges touching the %d new entities and a "
        "%g share of the others",
        fresh,
        cfg.growth.replay_fraction,
    )
    return NewEdges(rows, cfg.growth.replay_fraction)
