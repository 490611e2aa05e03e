"""What a communication strategy is: the hooks the distributed trainer calls, and its inputs.

A strategy keeps one trainer's copy of the *shared parameters* (relation operators, global
embeddings, unpartitioned entity tables and their Adagrad state) in step with the other
trainers' copies. The trainer calls its hooks at fixed points:

=====================  ==========================================================================
hook                   when
=====================  ==========================================================================
``start()``            once, after every trainer holds rank 0's values; starts its threads
``gate``               per batch: a :class:`~bigembed.train.hogwild.gate.BatchGate` every Hogwild
                       worker passes before each batch (a synchronous strategy holds the workers
                       there until its round has merged their last ``sync_every`` batches), or
                       None
``bucket_started()``   before the workers start a bucket
``bucket_finished()``  after they finished it (the trainer is idle until the next one)
``flush(timeout)``     at a checkpoint, first: this trainer's changes reach the others
``agree(timeout)``     at a checkpoint, after every trainer has flushed (a barrier), while no
                       worker trains: afterwards this trainer holds the values the checkpoint
                       commits (the collective strategies: the same bits on every trainer)
``stop()``             once, after the last checkpoint; ends its threads
=====================  ==========================================================================

The hooks run on the trainer's main thread and must not block longer than ``timeout``;
communication runs on the strategy's own threads, which report a failure through ``on_error``
(the watchdog then stops every rank). Tensors are touched through ``.data``: autograd never
sees a strategy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec
from bigembed.config import STRATEGIES
from bigembed.train import BatchGate


@dataclass(frozen=True)
class SharedTensors:
    """The shared parameters, by name (``param/...``, ``adagrad/...``, ``emb/TYPE``,
    ``emb_state/TYPE``); ``nonnegative``: indices of the Adagrad accumulators, which must stay
    >= 0 (a lossy exchange may bring one near 0 slightly below); ``row_tables``: the embedding
    tables among them, as ``{index of the (rows, dim) table: index of its row state}`` (row
    Adagrad: one value per row), whose changes are row-sparse: a strategy may send only the
    rows changed since its last round (``StrategyEnv.sparse_rows``), each row's state with it."""

    names: Sequence[str]
    tensors: Sequence[Tensor]
    nonnegative: frozenset[int]
    row_tables: Mapping[int, int] = field(default_factory=dict)

    @property
    def flat(self) -> list[Tensor]:
        return [t.data.view(-1) for t in self.tensors]

    @property
    def numels(self) -> list[int]:
        return [t.numel() for t in self.tensors]


@dataclass(frozen=True)
class StrategyEnv:
    """Where a strategy runs: this trainer, the others, the transport and the settings."""

    rank: int
    trainers: Sequence[int]
    group: dist.ProcessGroup | None  # the trainers' gloo group
    codec: Codec  # communication.precision
    workers: int  # Hogwild workers of this trainer (the gate's slots)
    sync_every: int  # batches between the rounds of a synchronous strategy
    sync_interval: float  # least seconds between rounds of an asynchronous one
    on_error: Callable[[str], None]  # a communication thread failed: stop the run
    #: the gate the workers pass (None: the strategy makes its own). Data-parallel training
    #: starts a strategy per bucket over that bucket's tables: they all share the run's gate.
    gate: BatchGate | None = None
    #: send row tables' changes as row-sparse deltas (``communication.sparse_rows``)
    sparse_rows: bool = False
    #: with ``sparse_rows``: the most rows of a row table a data round sends, as a fraction of
    #: the table's rows (the largest changes; ``communication.row_fraction``, 1: all)
    row_fraction: float = 1.0
    #: a synchronous strategy opens the gate once a round's snapshot is taken, so its
    #: communication overlaps the next ``sync_every`` batches (``communication.overlap``)
    overlap: bool = False
    #: the trainers are data-parallel replicas training shares of the same bucket (not
    #: disjoint buckets): a summing collective (``allreduce``) averages their changes instead,
    #: as Bagua's gradient allreduce does (see :mod:`.allreduce`)
    replicas: bool = False
    #: reduce within a host first, then across hosts (``communication.hierarchical``)
    hierarchical: bool = True
    #: each trainer's host id, in the order of ``trainers`` (None: unknown, all reductions flat)
    hosts: Sequence[str] | None = None
    #: a new client of the rendezvous store (for a thread of its own), where
    #: ``async_decentralized`` pairs the trainers that are ready
    store_client: Callable[[], dist.Store] | None = None


class Strategy(ABC):
    """One way of keeping the shared parameters in step (see the module docstring)."""

    #: Bagua's axes: a central party (servers or an all-reduce over everybody) or neighbours
    #: only; do the workers wait for the exchange.
    centralized: ClassVar[bool]
    synchronous: ClassVar[bool]
    #: True when ``agree`` alone merges every change a trainer made (a collective round over
    #: everybody while no worker trains), so that a caller about to agree may skip ``flush``
    #: and the barrier after it: one round per checkpoint instead of two.
    agreement_merges_everything: ClassVar[bool] = False
    #: the trainers' changes are merged by their mean (gossip, model averaging; ``allreduce``
    #: between replicas), not their sum (a parameter server; ``allreduce`` between trainers of
    #: disjoint buckets)
    averages: bool = True

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        self.env = env
        self.shared = shared
        self.gate: BatchGate | None = None

    @property
    def name(self) -> str:
        """The ``communication.strategy`` value that selects it (the registry's, not a copy)."""
        return STRATEGIES.name_of(type(self))

    @abstractmethod
    def start(self) -> None: ...

    def bucket_started(self) -> None:  # noqa: B027 (a hook: most strategies ignore it)
        """The workers start a bucket."""

    def bucket_finished(self) -> None:  # noqa: B027
        """The workers finished a bucket."""

    @abstractmethod
    def flush(self, timeout: float) -> None: ...

    @abstractmethod
    def agree(self, timeout: float) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @property
    @abstractmethod
    def rounds(self) -> int:
        """Rounds that exchanged data so far."""

    @property
    @abstractmethod
    def bytes_sent(self) -> int:
        """Bytes this trainer's strategy put on the network."""

    @property
    @abstractmethod
    def bytes_received(self) -> int:
        """Bytes it took off the network."""

    def wire_bytes(self) -> int:
        """This trainer's share of the traffic, so that the sum over trainers counts each byte
        once: what it sent (what it received is another trainer's send)."""
        return self.bytes_sent
