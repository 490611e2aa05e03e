"""Calibrating the cost model (:mod:`bigembed.train.memory.cost`): seconds per edge, not counts.

The analytic per-edge costs count multiply-adds; on a real CPU a ``d × d`` matrix product is
relatively cheaper than its count says and gathers relatively dearer. Two ways to measure:

* :func:`fit_from_buckets` (what the lock server uses): from the step statistics training
  already collects, the busy seconds of each bucket trained in the first step and its edges
  per relation *signature* (operator, all_negs), a least-squares fit of seconds per edge per
  signature, starting from the analytic ratios. The buckets' relation mixes must differ
  enough to tell the signatures apart (a well-conditioned fit with positive costs); otherwise
  only the common scale is fitted and the analytic ratios are kept (logged).
* :func:`calibrate`: a tiny timing run of each signature on a few batches of random edges
  against small random tables with the real training step, on a throwaway copy of the model.
  Not used by the lock server: a timing run on rank 0 alone at start-up would hold up the
  trainers' first gloo round of the shared parameters (the fit above needs no extra run).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from bigembed.buckets import Batch, negative_settings
from bigembed.config import ConfigSchema, model_spec
from bigembed.kernels import BatchTrainer, Table, choose_kernel
from bigembed.model import ScoringModel
from bigembed.train.memory.cost import CostModel, Signature, signature_of

logger = logging.getLogger(__name__)

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
    negs = negative_settings(cfg)
    trainer = BatchTrainer(
        model,
        [torch.zeros_like(p) for p in model.parameters()],
        negs,
        cfg.lr,
        cfg.resolved_relation_lr(),
        gen,
        native=choose_kernel(cfg.kernel, model, negs).step_kernel(model, negs),
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


@dataclass(frozen=True)
class BucketSample:
    """One bucket trained: its edges per signature and the workers' busy seconds on it."""

    edges: Mapping[Signature, float]
    seconds: float


#: The largest condition number of the (column-scaled) fit that is trusted per signature.
MAX_CONDITION = 20.0


def fit_from_buckets(prior: CostModel, samples: Iterable[BucketSample]) -> CostModel | None:
    """Seconds per edge of each signature of ``prior`` fitted to ``samples`` (None: too few).

    Fits ``seconds ≈ Σ_sig edges_sig · prior_sig · m_sig`` by least squares. When the fit is
    ill-conditioned (every bucket has about the same mix) or gives a cost <= 0, every ``m`` is
    the one common scale (the analytic ratios stay)."""
    rows = [s for s in samples if s.seconds > 0 and sum(s.edges.values()) > 0]
    sigs = sorted(prior.per_edge)
    if len(rows) < max(2, 2 * len(sigs)):
        return None
    base = np.array([prior.per_edge[g] for g in sigs], dtype=np.float64)
    a = np.array([[r.edges.get(g, 0.0) for g in sigs] for r in rows]) * base
    y = np.array([r.seconds for r in rows])
    scale = float(y.sum() / a.sum())
    used = a.sum(axis=0) > 0
    mult = np.full(len(sigs), scale)
    if used.sum() > 1:
        cols = a[:, used] / np.linalg.norm(a[:, used], axis=0)
        fit, *_ = np.linalg.lstsq(a[:, used], y, rcond=None)
        cond = float(np.linalg.cond(cols))
        if cond <= MAX_CONDITION and (fit > 0).all():
            mult[used] = fit
        else:
            logger.info(
                "cost model: the buckets' relation mixes do not tell the signatures apart "
                "(condition %.0f, fit %s): kept the analytic ratios, fitted the scale only",
                cond,
                fit.round(12).tolist(),
            )
    fitted = CostModel.calibrated(
        {g: float(b * m) for g, b, m in zip(sigs, base, mult, strict=True)}
    )
    fitted._rel_counts = prior._rel_counts  # the buckets' relation counts, read once
    return fitted
