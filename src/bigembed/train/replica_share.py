"""A replica's share of a bucket in data-parallel training: which batches it trains, in what order.

In ``distributed_mode: data_parallel`` every trainer (replica) trains the same bucket at the
same time. Each plans the bucket's batches exactly as one machine would (the same shuffled
edges, the same seed, hence the same plan on every replica), gives every batch a cost, and
keeps the batches that ``communication.edge_split`` assigns it:

* ``load_balancing``: Bagua's load-balancing sampler (:func:`bigembed.sampling.balanced_split`)
  over the batches' costs: sorted by cost (with ``random_level`` noise), cut into groups of one
  batch per replica, the groups shuffled, replica *i* taking the *i*-th batch of every group.
  At every position of their sequences the replicas hold batches of about the same cost, so at
  every synchronous round (``sync_every`` batches) they have done about the same work and
  nobody waits long at the gate;
* ``even``: equal contiguous slices of the plan (as a sampler that ignores cost would).

A batch's cost is the cost model's per-edge cost of its relation (operator, negatives, the
candidates of ``all_negs``; :mod:`bigembed.train.memory.cost`) summed over its edges; with
grouped queries (KvsAll) each query costs a score row against every candidate, so a batch costs
its distinct queries times that. Bagua pads the item list by repeating items so that every
replica gets as many; a bucket's batch is trained once here, so the sampler cuts whole groups
(``drop_last``) and the fewer than ``replicas`` batches left over go at the end, one to each of
the first replicas (the replicas' batch counts differ by at most one; a replica that is done
joins the remaining rounds idle).

The split is of expected cost; replicas do not run at the same speed. With
``communication.replica_stealing`` (one worker per trainer) a replica that is done takes the
unstarted batches of the others (:mod:`bigembed.train.replica_claims`): each replica then
prepares every share of the bucket and trains the batches its claims hand out, its own share
first and in the sampler's order.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from bigembed.buckets import batch_plan, bucket_sides
from bigembed.partition_keys import Bucket
from bigembed.sampling import balanced_split, even_split
from bigembed.train.hogwild.pool import HogwildPool
from bigembed.train.iteration import Iteration, mix_seed
from bigembed.train.job import TrainingJob
from bigembed.train.memory.cost import analytic_per_edge, signature_of
from bigembed.train.memory.edge_buffers import PreparedEdges
from bigembed.train.replica_claims import CounterStore, ReplicaClaims

Edges = tuple[Tensor, Tensor, Tensor, Tensor | None]

#: A grouped plan's side code (``bigembed.buckets.batching.PLAN_SIDES``) whose corrupted side
#: is the rhs: its queries are ``(lhs, relation)``.
_RHS_SIDE = 2


class ReplicaShare:
    """Replica ``replica`` of ``replicas``: its batches of every bucket (module docstring)."""

    def __init__(
        self,
        job: TrainingJob,
        replica: int,
        replicas: int,
        store: CounterStore | None = None,
    ) -> None:
        """``store``: the run's store, where the replicas take each other's batches
        (``communication.replica_stealing``, one worker per trainer); None: a fixed split."""
        if not 0 <= replica < replicas:
            raise ValueError(f"replica {replica} of {replicas}")
        self.job = job
        self.cfg = job.cfg
        self.replica = replica
        self.replicas = replicas
        stealing = self.cfg.communication.replica_stealing and self.cfg.resolved_workers() == 1
        self.store = store if stealing and replicas > 1 else None
        self._claims: list[ReplicaClaims] = []  # the last buckets' (released two buckets on)
        self.counts = job.partition_counts()
        #: batches this replica kept, and batches planned over whole buckets, so far
        self.batches_kept = 0
        self.batches_planned = 0

    # ------------------------------------------------------------------ costs
    def relation_costs(self, bucket: Bucket) -> tuple[np.ndarray, np.ndarray]:
        """Per relation index of ``bucket``: (cost per edge, cost per query of a grouped
        plan: a score row against the corrupted side's candidates)."""
        cfg = self.cfg
        per_edge, per_query = [], []
        for idx, (lhs_key, rhs_key) in enumerate(bucket_sides(cfg, bucket)):
            rows = (self.counts.get(lhs_key, 0) + self.counts.get(rhs_key, 0)) // 2
            per_edge.append(analytic_per_edge(cfg, signature_of(cfg, idx), rows))
            per_query.append(float(rows * cfg.dimension))
        return np.asarray(per_edge, dtype=np.float64), np.asarray(per_query, dtype=np.float64)

    def batch_costs(
        self, bucket: Bucket, edges: Edges, order: Tensor, plan: np.ndarray
    ) -> np.ndarray:
        """The cost of each batch of ``plan`` (rows ``(begin, end, relation_idx, side)`` over
        the edges ``order[begin:end]``)."""
        per_edge, per_query = self.relation_costs(bucket)
        rel = edges[2][order].numpy()
        rel_idx = np.zeros_like(rel) if self.cfg.dynamic_relations else rel
        if plan.size == 0 or int(plan[:, 3].max()) == 0:  # not grouped: the edges' costs
            cum = np.concatenate([[0.0], np.cumsum(per_edge[rel_idx])])
            return cum[plan[:, 1]] - cum[plan[:, 0]]
        # grouped queries: a batch costs its distinct queries' score rows (+ its edges' rows)
        lhs, rhs = edges[0][order].numpy(), edges[1][order].numpy()
        out = np.empty(plan.shape[0], dtype=np.float64)
        for k, (begin, end, _, side) in enumerate(plan.tolist()):
            anchor = lhs[begin:end] if side == _RHS_SIDE else rhs[begin:end]
            r = rel[begin:end]
            new_query = np.ones(end - begin, dtype=bool)
            new_query[1:] = (anchor[1:] != anchor[:-1]) | (r[1:] != r[:-1])
            queries = int(new_query.sum())
            out[k] = queries * per_query[rel_idx[begin]] + 2 * self.cfg.dimension * (end - begin)
        return out

    # ------------------------------------------------------------------ the share
    def assignment(self, it: Iteration, bucket: Bucket, costs: np.ndarray) -> list[Tensor]:
        """Every replica's batches (indices into the plan, in training order): together they
        hold every batch exactly once."""
        n = int(costs.shape[0])
        if self.cfg.communication.edge_split == "even":
            shares = even_split(n, self.replicas, drop_last=True)
        else:
            shares = balanced_split(
                torch.from_numpy(costs),
                self.replicas,
                seed=mix_seed(self.cfg.seed, 7, *bucket) % (1 << 31),
                epoch=it.index,
                shuffle=True,
                random_level=self.cfg.communication.random_level,
                drop_last=True,
            )
        # The n mod replicas batches no group holds go last, one each to the first replicas
        # (costliest first), so the replicas' sequences stay aligned position by position.
        left = np.ones(n, dtype=bool)
        for share in shares:
            left[share.numpy()] = False
        rest = np.nonzero(left)[0]
        rest = rest[np.argsort(-costs[rest], kind="stable")]
        return [
            torch.cat([share, torch.from_numpy(rest[r : r + 1])]) if r < rest.shape[0] else share
            for r, share in enumerate(shares)
        ]

    def prepare(
        self, it: Iteration, bucket: Bucket, pool: HogwildPool, edges: Edges, seed: int
    ) -> PreparedEdges:
        """This replica's batches of ``edges`` for ``pool`` (see
        :class:`bigembed.train.loop.EdgeShare`)."""
        cfg = self.cfg
        queries = (edges[0], edges[1]) if cfg.train_type == "kvsall" else None
        planned_order, plan = batch_plan(
            edges[2], cfg.batch_size, cfg.dynamic_relations, np.random.default_rng(seed), queries
        )
        order = torch.arange(edges[0].shape[0]) if planned_order is None else planned_order
        costs = self.batch_costs(bucket, edges, order, plan)
        shares = self.assignment(it, bucket, costs)
        mine = shares[self.replica].numpy()
        self.batches_planned += int(plan.shape[0])
        self.batches_kept += int(mine.shape[0])
        claims = None
        if self.store is not None:  # every share, this replica's first when it iterates
            mine = torch.cat(shares).numpy()
            prefix = f"claims/v{it.version}/b{bucket[0]}-{bucket[1]}"
            claims = ReplicaClaims(self.store, prefix, [len(t) for t in shares], self.replica)
            # a bucket's counters can go once the bucket after it has started on every replica
            claims.release_first = self._claims[:-1]
            self._claims = [*self._claims[-1:], claims]
        rows = plan[mine].reshape(-1, 4)
        sizes = rows[:, 1] - rows[:, 0]
        begins = (np.cumsum(sizes) - sizes).astype(np.int64)
        pieces = [order[b:e] for b, e in zip(rows[:, 0].tolist(), rows[:, 1].tolist(), strict=True)]
        my_order = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
        my_plan = np.stack([begins, begins + sizes, rows[:, 2], rows[:, 3]], 1).astype(np.int64)
        return pool.prepare_planned(edges, my_order, my_plan.reshape(-1, 4), seed, claims=claims)
