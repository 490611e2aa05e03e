"""Calibrating the cost model (:mod:`bigembed.buckets.cost`) with a tiny timing run.

The analytic per-edge costs count multiply-adds; on a real CPU a ``d × d`` matrix product is
relatively cheaper than its count says and gathers relatively dearer. So before a run that
balances by cost, each relation *signature* (operator, all_negs) is timed on a few batches of
random edges against small random tables with the real training step, on a throwaway copy of
the model (the job's parameters are not touched). A few batches per signature: well under a
second for typical configs, whatever the number of relation types.
"""

from __future__ import annotations

import statistics
import time

import torch

from bigembed.buckets.batching import Batch
from bigembed.buckets.cost import CostModel, Signature, signature_of
from bigembed.buckets.negative_settings import negative_settings
from bigembed.config import ConfigSchema, model_spec
from bigembed.model.scoring import ScoringModel
from bigembed.train.step import BatchTrainer, Table

#: Rows of the random tables (the partition size with ``all_negs``, capped: it sets that cost).
_ROWS = 4096
_ALL_NEGS_ROWS_CAP = 50_000


def _table(rows: int, dim: int, gen: torch.Generator) -> Table:
    return Table(torch.randn(rows, dim, generator=gen) * 0.1, torch.zeros(rows))


def calibrate(
    cfg: ConfigSchema,
    num_relations: int,
    *,
    all_negs_rows: int = _ROWS,
    batches: int = 3,
    seed: int = 0,
) -> CostModel:
    """Seconds per edge of every relation signature of ``cfg``, measured (median of
    ``batches`` timed batches after one warm-up batch, one thread)."""
    gen = torch.Generator().manual_seed(seed)
    model = ScoringModel(model_spec(cfg, num_relations))
    trainer = BatchTrainer(
        model,
        [torch.zeros_like(p) for p in model.parameters()],
        negative_settings(cfg),
        cfg.lr,
        cfg.resolved_relation_lr(),
        gen,
    )
    first: dict[Signature, int] = {}
    for k in range(len(cfg.relations) if not cfg.dynamic_relations else 1):
        first.setdefault(signature_of(cfg, k), k)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a Hogwild worker runs
    try:
        per_edge: dict[Signature, float] = {}
        for sig, k in first.items():
            rel = cfg.relations[k]
            rows = min(all_negs_rows, _ALL_NEGS_ROWS_CAP) if sig[1] else _ROWS
            lhs = _table(rows, cfg.entity_dimension(rel.lhs), gen)
            rhs = lhs if rel.lhs == rel.rhs else _table(rows, cfg.entity_dimension(rel.rhs), gen)
            n = cfg.batch_size
            times = []
            for b in range(batches + 1):
                batch = Batch(
                    torch.randint(rows, (n,), generator=gen),
                    torch.randint(rows, (n,), generator=gen),
                    torch.full((n,), k, dtype=torch.int64),
                    0 if cfg.dynamic_relations else k,
                    None,
                )
                t0 = time.perf_counter()
                trainer.step(batch, lhs, rhs)
                if b > 0:
                    times.append(time.perf_counter() - t0)
            per_edge[sig] = statistics.median(times) / n
    finally:
        torch.set_num_threads(threads)
    return CostModel.calibrated(per_edge)
