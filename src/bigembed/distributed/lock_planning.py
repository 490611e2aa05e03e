"""What the lock server of a distributed run is told about buckets, and when it starts.

Rank 0 runs the lock server (:mod:`bigembed.distributed.lock_server`). This module gives it a
bucket's lockable partitions (:func:`side_keys`), the plan of each pass (edge counts per bucket
and, with ``load_balancing: cost``, each bucket's estimated seconds from the cost model), and
keeps that cost model calibrated from the first committed step (:class:`LockCosts`).
"""

from __future__ import annotations

import logging

from bigembed.buckets import bucket_sides, chunk_sizes
from bigembed.checkpoints import CheckpointStore
from bigembed.config import ConfigSchema
from bigembed.distributed.context import DistContext
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.lock_server import (
    BucketScheduler,
    EventLog,
    LockServer,
    PassPlan,
    SideKeys,
)
from bigembed.partition_keys import Bucket
from bigembed.train import (
    BucketRecord,
    BucketSample,
    CostModel,
    TrainingJob,
    bucket_costs,
    fit_from_buckets,
    iterations,
)

logger = logging.getLogger(__name__)

EVENT_LOG = "lock_events.jsonl"


def side_keys(cfg: ConfigSchema, bucket: Bucket) -> SideKeys:
    """The partitioned (lockable) keys of a bucket's lhs and rhs sides. A featurized type's
    partitions are not locked: they hold no parameters of their own (their bags are read-only)
    and share the type's feature table, which is synced like the other shared parameters."""
    parted = {t for t, e in cfg.entities.items() if e.num_partitions > 1 and not e.featurized}
    sides = bucket_sides(cfg, bucket)
    lhs = frozenset(k for k, _ in sides if k[0] in parted)
    rhs = frozenset(k for _, k in sides if k[0] in parted)
    return lhs, rhs


def lock_cost_model(job: TrainingJob) -> CostModel | None:
    """The analytic cost model the ``cost`` grant policy starts from (None with
    ``load_balancing: pbg``, which weighs buckets by edge count); :class:`LockCosts` replaces it
    with seconds per edge fitted to the first step's buckets."""
    cfg = job.cfg
    if cfg.load_balancing != "cost":
        return None
    counts = job.partition_counts()
    rows = max(counts.values(), default=1) if counts else 1
    model = CostModel.analytic(cfg, all_negs_rows=rows)
    logger.info("cost model (multiply-adds per edge): %s", model.per_edge)
    return model


class LockCosts:
    """Rank 0: the lock server's cost model, calibrated once from the step statistics.

    After the first step this run trains, the busy seconds of every bucket (all trainers'
    records, merged on rank 0) and its edges per relation signature give seconds per edge per
    signature (:func:`~bigembed.train.memory.cost_calibration.fit_from_buckets`); the passes
    planned after that use them. There is no timing run at start-up: rank 0 alone pausing
    there would hold up the trainers' first gloo round of the shared parameters until it times
    out."""

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.model = lock_cost_model(job)
        self.calibrated = self.model is None

    def observe(self, records: list[BucketRecord]) -> None:
        """The merged bucket records of a committed step (only the first one is used)."""
        if self.calibrated or self.model is None:
            return
        self.calibrated = True
        cfg, model = self.job.cfg, self.model
        samples = []
        for r in records:
            if r.timing is None or r.stats.count == 0:
                continue
            key = r.at.edge_path_idx
            bucket = (r.lhs_partition, r.rhs_partition)
            shares = model.signature_shares(cfg, self.job.edge_stores[key], bucket, key)
            seconds = sum(r.timing.worker_seconds) or r.timing.train_seconds
            samples.append(BucketSample({g: f * r.stats.count for g, f in shares.items()}, seconds))
        fitted = fit_from_buckets(model, samples)
        if fitted is not None:
            self.model = fitted
            logger.info(
                "cost model calibrated from %d buckets (s/edge): %s", len(samples), fitted.per_edge
            )


def start_lock_server(
    ctx: DistContext,
    job: TrainingJob,
    checkpoint: CheckpointStore,
    committed: int,
    fresh: bool,
    costs: LockCosts,
) -> LockServer:
    """Rank 0: start the lock server of a run resumed at ``committed`` (logs to EVENT_LOG)."""
    cfg = job.cfg

    def plan_for(index: int) -> PassPlan:
        it = next(iterations(cfg.num_epochs, len(cfg.edge_paths), job.num_chunks, index))
        store = job.edge_stores[it.edge_path_idx]
        weights = chunk_sizes(store, it.chunk, job.num_chunks)
        tree = bool(cfg.distributed_tree_init_order) and index == 0 and fresh
        model = costs.model
        if model is None:
            return PassPlan(index, weights, tree)
        per_bucket = bucket_costs(cfg, store, it.chunk, job.num_chunks, model, it.edge_path_idx)
        return PassPlan(index, weights, tree, per_bucket)

    log = EventLog(checkpoint.path / EVENT_LOG)
    log.write(
        "run_start",
        committed=committed,
        trainers=RankLayout.of(cfg).num_trainers,
        partition_servers=cfg.num_partition_servers,
    )
    server = LockServer(
        ctx.address.namespaced(ctx.address.client(ctx.timeout)),
        BucketScheduler(
            lambda b: side_keys(cfg, b),
            plan_for,
            log,
            policy=cfg.load_balancing,
            trainers=ctx.layout.num_trainers,
        ),
        ctx.fail,
        session=ctx.session,
        trainers=ctx.layout.num_trainers,
    )
    server.start()
    return server
