"""Data-parallel replicas kept in step: every parameter, entity tables included, bucket by bucket.

In ``distributed_mode: data_parallel`` every trainer holds a full replica of what the current
bucket needs (the model, the unpartitioned tables, the bucket's partitions) and trains its
share of the bucket's batches (:mod:`bigembed.train.replica_share`). :class:`ReplicaSync`
keeps the replicas in step with the configured communication strategy
(:mod:`bigembed.communication.strategies`), which sees every tensor of the bucket:

* at the start of a bucket (an observer call; every trainer trains the same bucket at the same
  time) it starts a strategy over the model's parameters and Adagrad state and every table of
  the bucket, with the tables marked as row tables (``SharedTensors.row_tables``) so that
  ``communication.sparse_rows`` sends only the rows changed since the last round, and as
  replicas of one bucket (``StrategyEnv.replicas``: ``allreduce`` then averages the replicas'
  changes, as Bagua's gradient allreduce does, instead of summing them);
* at the end of the bucket it flushes, waits for every trainer (a barrier), agrees (afterwards
  every trainer holds the same values; a strategy whose agreement merges every change by
  itself, ``Strategy.agreement_merges_everything``, skips the flush and the barrier: one
  round per bucket end instead of two), stops the strategy, and checks that the replicas are
  equal bit for bit (a digest of every tensor, all-gathered); a strategy whose agreement is not
  bit-exact (``async_ps`` with a lossy codec) is repaired by rank 0's values, broadcast.

So between buckets the replicas are identical, and each can swap the bucket's partitions out
to its own disk (rank 0 to the checkpoint, the others to a private scratch directory): no
partition crosses the network as a whole and no disk needs to be shared. All strategies share
the run's gate (:class:`~bigembed.train.hogwild.gate.BatchGate`), created once, which the
workers hold. The start: every trainer takes rank 0's values (:meth:`ReplicaSync.broadcast_start`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication import (
    SharedTensors,
    Strategy,
    make_strategy,
)
from bigembed.distributed.context import DistContext
from bigembed.errors import PeerError
from bigembed.kernels import Table
from bigembed.partition_keys import PartitionKey
from bigembed.train import BatchGate, BucketRecord, BucketWork, ModelState, Observer

logger = logging.getLogger(__name__)


class ReplicaSync(Observer):
    """One trainer's side of the data-parallel exchange (see the module docstring)."""

    def __init__(self, ctx: DistContext, state: ModelState) -> None:
        self.ctx = ctx
        self.state = state
        self.cfg = ctx.cfg
        self.gate = BatchGate(self.cfg.resolved_workers())
        self.strategy_name = self.cfg.communication.strategy
        self.strategy: Strategy | None = None
        #: totals over the run (every bucket's strategy, repairs included)
        self.rounds = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.repairs = 0  # buckets whose replicas differed after the agreement
        self.merge = ""  # how the last bucket's strategy merged the replicas' changes

    # ------------------------------------------------------------------ tensors
    def _model_tensors(self) -> tuple[list[str], list[Tensor]]:
        names, tensors = [], []
        named = self.state.model.named_parameters()
        for (name, param), adagrad in zip(named, self.state.adagrad, strict=True):
            names += [f"param/{name}", f"adagrad/{name}"]
            tensors += [param, adagrad]
        return names, tensors

    def shared_tensors(self, tables: dict[PartitionKey, Table]) -> SharedTensors:
        """The model and ``tables``, with the tables as row tables; a table seen under several
        keys (the partitions of a featurized type share its feature table) counts once."""
        names, tensors = self._model_tensors()
        rows: dict[int, int] = {}
        seen: set[int] = set()
        for (etype, part), table in sorted(tables.items()):
            if id(table.emb) in seen:
                continue
            seen.add(id(table.emb))
            rows[len(tensors)] = len(tensors) + 1
            names += [f"emb/{etype}/{part}", f"emb_state/{etype}/{part}"]
            tensors += [table.emb, table.state]
        nonnegative = frozenset(
            i for i, n in enumerate(names) if n.startswith(("adagrad/", "emb_state/"))
        )
        return SharedTensors(names, tensors, nonnegative, rows)

    # ------------------------------------------------------------------ start
    def broadcast_start(self) -> None:
        """Every trainer takes rank 0's model (parameters, Adagrad state, buffers)."""
        _, tensors = self._model_tensors()
        with torch.no_grad():
            for t in [*tensors, *self.state.model.buffers()]:
                self.broadcast(t)

    def broadcast(self, t: Tensor) -> None:
        """Rank 0's value of ``t`` on every trainer."""
        dist.broadcast(t.data, src=0, group=self.ctx.trainer_group)
        if self.ctx.rank == 0:
            self.bytes_sent += t.numel() * t.element_size() * (len(self.ctx.layout.trainers) - 1)

    # ------------------------------------------------------------------ the loop's calls
    def bucket_started(self, work: BucketWork) -> None:
        cfg, ctx = self.cfg, self.ctx
        env = ctx.strategy_env(
            gate=self.gate, sparse_rows=cfg.communication.sparse_rows, replicas=True
        )
        strategy = make_strategy(self.strategy_name, env, self.shared_tensors(work.tables))
        strategy.start()
        strategy.bucket_started()
        self.strategy = strategy

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        strategy, self.strategy = self.strategy, None
        assert strategy is not None
        bucket = f"{work.bucket[0]}-{work.bucket[1]}"
        timeout = self.ctx.timeout * 2
        try:
            strategy.bucket_finished()
            if not strategy.agreement_merges_everything:  # else the agreement is the flush
                strategy.flush(timeout)
                self.ctx.barrier(f"v{work.it.version}/b{bucket}/trained")
            strategy.agree(timeout)
        except TimeoutError as exc:
            raise PeerError(str(exc)) from None
        finally:
            strategy.stop()
        self.merge = "averaged" if strategy.averages else "summed"
        self.rounds += strategy.rounds
        self.bytes_sent += strategy.bytes_sent
        self.bytes_received += strategy.bytes_received
        self._make_equal(self.shared_tensors(work.tables).tensors)  # all, whatever was sent

    # ------------------------------------------------------------------ equality
    def _make_equal(self, tensors: Iterable[Tensor]) -> None:
        """Check that every trainer holds the same bits; where not, take rank 0's."""
        tensors = list(tensors)
        mine = torch.tensor([digest([t]) for t in tensors], dtype=torch.int64)
        everyone = [torch.zeros_like(mine) for _ in self.ctx.layout.trainers]
        dist.all_gather(everyone, mine, group=self.ctx.trainer_group)
        differ = torch.zeros_like(mine, dtype=torch.bool)
        for theirs in everyone:
            differ |= theirs != everyone[0]
        if not bool(differ.any()):
            return
        self.repairs += 1
        logger.debug("replicas differ after the agreement in %d tensors", int(differ.sum()))
        with torch.no_grad():
            for t, bad in zip(tensors, differ.tolist(), strict=True):
                if bad:  # the same decision on every trainer (the same gathered digests)
                    self.broadcast(t)

    def wire_bytes(self) -> int:
        """This trainer's share of the traffic (each byte counted once over the trainers)."""
        return self.bytes_sent


def digest(tensors: Iterable[Tensor]) -> int:
    """A 63-bit digest of the tensors' bytes (equal bits, equal digest). SHA-1, for speed
    (CPUs' SHA instructions: ~4x BLAKE2b here, and it runs after every bucket), not secrecy."""
    h = hashlib.sha1(usedforsecurity=False)
    for t in tensors:
        data = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
        h.update(data.data)  # the array's buffer, no copy
    return int.from_bytes(h.digest()[:8], "little") & 0x7FFFFFFFFFFFFFFF
