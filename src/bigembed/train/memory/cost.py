"""The cost model: how long a bucket takes to train, relative to the others.

Edge counts alone mislead on a skewed graph: a ``linear`` relation costs about ``d²`` per edge
for its operator, a ``diagonal`` one ``d``; every edge is scored against its negatives
(``(num_batch_negs + num_uniform_negs) · d`` per corrupted side, or a whole partition with
``all_negs``). A bucket's cost is the sum over its relation types of edges × per-edge cost.

The per-edge costs come from one of two sources:

* :meth:`CostModel.analytic`: multiply-adds per edge, from the config alone (no timing);
* :meth:`CostModel.calibrated`: seconds per edge measured by a tiny timing run of the real step
  (:mod:`bigembed.train.memory.cost_calibration`), one figure per *signature* (operator, all_negs),
  since relations with the same signature cost the same.

Relations are told apart per bucket by counting each relation id in the bucket's ``rel``
column once (memory-mapped, read once per edge set); with dynamic relations every id shares
the template's signature, so only edge counts matter. Users: the lock server's ``cost`` grant
policy (:mod:`bigembed.distributed.lock_server`) and, through :func:`bucket_costs`, anything
ordering buckets on one machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from bigembed.config import ConfigSchema
from bigembed.model import OPERATOR_MADDS
from bigembed.partition_keys import Bucket
from bigembed.storage import EdgeStore, chunk_range

Signature = tuple[str, bool]
"""What a relation's per-edge cost depends on besides the shared settings: (operator, all_negs)."""


def signature_of(cfg: ConfigSchema, relation_idx: int) -> Signature:
    """The cost signature of relation ``relation_idx`` (the template with dynamic relations)."""
    r = cfg.relations[0] if cfg.dynamic_relations else cfg.relations[relation_idx]
    return (str(r.operator), bool(r.all_negs))


def analytic_per_edge(cfg: ConfigSchema, sig: Signature, all_negs_rows: int = 0) -> float:
    """Multiply-adds per edge: gathering and updating rows, the operator, scoring negatives.

    ``all_negs_rows``: the rows scored per corrupted side with ``all_negs`` (a partition).
    """
    operator, all_negs = sig
    d = cfg.dimension
    sides = int(not cfg.disable_lhs_negs) + int(not cfg.disable_rhs_negs)
    negs = all_negs_rows if all_negs else cfg.num_batch_negs + cfg.num_uniform_negs
    # 2 rows gathered and updated, the operator on the positive, each corrupted side's scores.
    return float(2 * d + OPERATOR_MADDS[operator](d) + sides * negs * d)


@dataclass
class CostModel:
    """Per-edge cost of each signature; :meth:`bucket_cost` adds them up over a bucket."""

    per_edge: dict[Signature, float]
    source: str = "analytic"  # or "calibrated"
    _rel_counts: dict[tuple[int, Bucket], np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def analytic(cls, cfg: ConfigSchema, all_negs_rows: int = 0) -> CostModel:
        sigs = {signature_of(cfg, k) for k in range(len(cfg.relations))}
        return cls({s: analytic_per_edge(cfg, s, all_negs_rows) for s in sigs}, "analytic")

    @classmethod
    def calibrated(cls, seconds_per_edge: Mapping[Signature, float]) -> CostModel:
        return cls(dict(seconds_per_edge), "calibrated")

    def relation_costs(self, cfg: ConfigSchema, num_relations: int) -> np.ndarray:
        """Per-edge cost of each relation id ``0 .. num_relations - 1``."""
        return np.array(
            [self.per_edge[signature_of(cfg, k)] for k in range(num_relations)], dtype=np.float64
        )

    def _counts(self, store: EdgeStore, key: int, bucket: Bucket) -> np.ndarray:
        """Edges of each relation id in the whole of ``bucket`` (cached per edge set)."""
        cached = self._rel_counts.get((key, bucket))
        if cached is None:
            n = store.num_edges(*bucket)
            rel = store.load_range(*bucket, 0, n).rel
            cached = np.bincount(np.asarray(rel, dtype=np.int64))
            self._rel_counts[(key, bucket)] = cached
        return cached

    def signature_shares(
        self, cfg: ConfigSchema, store: EdgeStore, bucket: Bucket, key: int = 0
    ) -> dict[Signature, float]:
        """The share of ``bucket``'s edges of each signature (they sum to 1; {} if empty)."""
        if len(self.per_edge) == 1:
            return {next(iter(self.per_edge)): 1.0}
        counts = self._counts(store, key, bucket)
        total = int(counts.sum())
        out: dict[Signature, float] = {}
        for rid, n in enumerate(counts.tolist()):
            if n:
                sig = signature_of(cfg, rid)
                out[sig] = out.get(sig, 0.0) + n / total
        return out

    def bucket_cost(
        self, cfg: ConfigSchema, store: EdgeStore, bucket: Bucket, edges: int, key: int = 0
    ) -> float:
        """Cost of ``edges`` edges of ``bucket`` (a chunk of it: the relation mix is assumed to
        be the bucket's, as a chunk is a contiguous slice of shuffled edges)."""
        if edges <= 0:
            return 0.0
        if len(self.per_edge) == 1:
            return edges * next(iter(self.per_edge.values()))
        counts = self._counts(store, key, bucket)
        total = int(counts.sum())
        if total == 0:
            return 0.0
        mean = float((counts * self.relation_costs(cfg, len(counts))).sum()) / total
        return edges * mean


def bucket_costs(
    cfg: ConfigSchema,
    store: EdgeStore,
    chunk: int,
    num_chunks: int,
    model: CostModel,
    key: int = 0,
) -> dict[Bucket, float]:
    """Cost of every non-empty bucket of ``store`` in chunk ``chunk`` of ``num_chunks``.

    ``key`` tells edge sets apart in the model's cache (their index in ``edge_paths``)."""
    out: dict[Bucket, float] = {}
    for bucket in store.buckets():
        n = store.num_edges(*bucket)
        if n > 0:
            start, end = chunk_range(n, chunk, num_chunks)
            out[bucket] = model.bucket_cost(cfg, store, bucket, end - start, key)
    return out
