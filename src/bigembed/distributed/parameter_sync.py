"""The shared parameters of a distributed run, kept in step across the trainers.

The model's parameters, their Adagrad state and the unpartitioned embeddings are the same on
every trainer: each starts from rank 0's values, and the configured communication strategy
(:mod:`bigembed.communication.strategies`; PBG's parameter servers by default) merges the
trainers' updates while they train.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication import SharedTensors, make_strategy
from bigembed.distributed.context import DistContext
from bigembed.errors import PeerError
from bigembed.train import BucketRecord, BucketWork, ModelState, Observer, PartitionStore

logger = logging.getLogger(__name__)

#: Names (see SharedParameterSync._shared_tensors) of the Adagrad accumulators: kept >= 0.
ACCUMULATOR_PREFIXES = ("adagrad/", "emb_state/")


class SharedParameterSync(Observer):
    """The shared parameters (model, Adagrad state, unpartitioned embeddings) kept in step
    across trainers by the configured communication strategy
    (:mod:`bigembed.communication.strategies`). It watches the loop as an observer only to
    tell the strategy when buckets start and end (a synchronous strategy rounds up a bucket's
    last batches when it ends); the strategy's gate, not the observer, holds workers back."""

    def __init__(self, ctx: DistContext, state: ModelState, partitions: PartitionStore) -> None:
        """Broadcast rank 0's values to every trainer, then start the strategy.

        The tensors must already be where they stay (shared memory, resident tables): the
        strategy holds views of them."""
        self.ctx = ctx
        cfg = ctx.cfg
        names, tensors = self._shared_tensors(state, partitions)
        with torch.no_grad():  # every trainer starts from rank 0's values
            for t in tensors:
                dist.broadcast(t.data, src=0, group=ctx.trainer_group)
        accumulators = frozenset(
            i for i, n in enumerate(names) if n.startswith(ACCUMULATOR_PREFIXES)
        )
        comm = cfg.communication
        env = ctx.strategy_env(sparse_rows=comm.sparse_rows)
        rows = {i: i + 1 for i, n in enumerate(names) if n.startswith("emb/")}  # then its state
        self.strategy = make_strategy(
            comm.strategy, env, SharedTensors(names, tensors, accumulators, rows)
        )
        self.strategy.start()

    @staticmethod
    def _shared_tensors(
        state: ModelState, partitions: PartitionStore
    ) -> tuple[list[str], list[Tensor]]:
        names, tensors = [], []
        named = state.model.named_parameters()
        for (name, param), adagrad in zip(named, state.adagrad, strict=True):
            names += [f"param/{name}", f"adagrad/{name}"]
            tensors += [param, adagrad]
        for key in sorted(partitions.pinned):
            table = partitions.get(key)
            names += [f"emb/{key[0]}", f"emb_state/{key[0]}"]
            tensors += [table.emb, table.state]
        return names, tensors

    # the strategy's bucket hooks
    def bucket_started(self, work: BucketWork) -> None:
        self.strategy.bucket_started()

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        self.strategy.bucket_finished()

    def flush(self) -> None:
        """Send this trainer's pending changes to the others."""
        self._call(self.strategy.flush)

    def agree(self) -> None:
        """After every trainer flushed: hold the values the checkpoint commits."""
        self._call(self.strategy.agree)

    def _call(self, hook: Callable[[float], None]) -> None:
        try:
            hook(self.ctx.timeout * 2)
        except TimeoutError as exc:
            raise PeerError(str(exc)) from None

    def stop(self) -> None:
        strategy = self.strategy
        strategy.stop()
        logger.info(
            "shared parameters (%s, %s): %d rounds, %d bytes sent, %d bytes received",
            strategy.name,
            strategy.env.codec.name,
            strategy.rounds,
            strategy.bytes_sent,
            strategy.bytes_received,
        )
