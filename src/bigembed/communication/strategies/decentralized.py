"""``decentralized``: no central party, synchronous. Each round every trainer averages its shared
parameters with one peer; the peers change from round to round.

Rounds are gated as in ``allreduce`` (every ``sync_every`` batches). Round k pairs the trainers
by the circle method (:func:`~bigembed.communication.primitives.peer_of`: every pair meets once
in ``W - 1`` rounds; with an odd W one trainer sits each round out). The two peers swap their
values and both continue from the average, keeping what their workers changed meanwhile.

Low precision (Bagua's low-precision decentralized SGD, in the CHOCO-gossip form): a trainer
keeps, per peer, the value that peer holds of it (``known_by``) and its own copy of the peer's
value (``estimate``), and sends ``Q(value - known_by)``; both sides add the decoded message to
their copy, so they stay equal bit for bit, and whatever the quantization dropped is still in
the next difference (error feedback without a separate residual). This costs two copies of the
shared parameters per peer met. Each round moves the whole shared set once per trainer.

The averages leave the trainers close, not equal; at a checkpoint (:meth:`agree`) they compute
the exact fp32 mean of everybody's values (a reduce-scatter and all-gather over all trainers),
so a checkpoint holds one agreed value.

Averaging divides each trainer's contribution to the shared parameters by two per meeting (as
any gossip averaging does): see ``async_model_average`` for what that does to sparse tables.

With ``communication.sparse_rows`` the row tables (``SharedTensors.row_tables``) and their row
state take the row-sparse form of both the pair exchange and the agreement
(:class:`~bigembed.communication.sparse_gossip.RowGossip`): only the rows that differ from
what the peer holds travel, with their indices.
"""

from __future__ import annotations

from torch import Tensor

from bigembed.communication.codecs import get_codec
from bigembed.communication.lockstep import LockstepRounds
from bigembed.communication.param_server import (
    Segment,
    ShardPlan,
    gather,
    scatter_add,
    scatter_copy,
)
from bigembed.communication.primitives import TAG_PAIR, ShardedReduce, exchange, peer_of
from bigembed.communication.segment_stream import SegmentStream
from bigembed.communication.sparse_gossip import RowGossip
from bigembed.communication.sparse_rows import row_tensors
from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv
from bigembed.train import BatchGate


class _Peer:
    """What this trainer keeps of one peer (created when they first meet)."""

    def __init__(self, initial: Tensor, sizes: list[int], env: StrategyEnv) -> None:
        self.known_by = initial.clone()  # the peer's copy of this trainer's values
        self.estimate = initial.clone()  # this trainer's copy of the peer's values
        self.outbox = SegmentStream(env.codec, sizes, feedback=False)
        self.inbox = SegmentStream(env.codec, sizes, feedback=False)


class Decentralized(Strategy):
    centralized = False
    synchronous = True
    agreement_merges_everything = True  # the agreement is the exact mean of every value

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        super().__init__(env, shared)
        self.flat = shared.flat
        sparse = env.sparse_rows and bool(shared.row_tables)
        skip = row_tensors(shared.row_tables) if sparse else frozenset()
        numels = [0 if i in skip else n for i, n in enumerate(shared.numels)]
        self.segments = [Segment(i, 0, n) for i, n in enumerate(numels) if n > 0]
        self.rows = (
            RowGossip(
                env.rank,
                env.trainers,
                env.group,
                env.codec,
                shared.tensors,
                shared.row_tables,
                fraction=env.row_fraction,
            )
            if sparse
            else None
        )
        self.sizes = [seg.size for seg in self.segments]
        # every trainer starts from rank 0's values: the copies of each other start equal
        self.initial = gather(self.flat, self.segments)
        self.peers: dict[int, _Peer] = {}
        self.pair_rounds = 0
        self.bytes_out = 0
        self.bytes_in = 0
        plan = ShardPlan(shared.names, numels, env.trainers, shared.nonnegative)
        self.plan = plan
        self.exact = ShardedReduce(env.rank, plan, get_codec("fp32"), env.group, env.trainers)
        self.gate = gate = env.gate or BatchGate(env.workers)
        self.rounds_thread = LockstepRounds(
            env.rank,
            env.trainers,
            env.group,
            gate,
            gated=True,
            sync_every=env.sync_every,
            interval=env.sync_interval,
            on_data=self._pair_round,
            on_agree=self._exact_mean,
            on_error=env.on_error,
            name=self.name,
            overlap=env.overlap,
        )

    # ------------------------------------------------------------------ rounds
    def _pair_round(self) -> None:
        env = self.env
        peer = peer_of(env.rank, env.trainers, self.pair_rounds)
        self.pair_rounds += 1
        if peer is None:
            return
        if self.rows is not None:
            self.rows.pair_round(peer)
        if not self.segments:
            return
        state = self.peers.get(peer)
        if state is None:
            state = self.peers[peer] = _Peer(self.initial, self.sizes, env)
        snap = gather(self.flat, self.segments)
        self.rounds_thread.snapshot_taken()  # communication.overlap: the workers go on
        message = state.outbox.encode(snap - state.known_by)
        state.known_by += state.outbox.decode(message)
        reply = state.inbox.empty()
        exchange({peer: message}, {peer: reply}, env.group, TAG_PAIR)
        self.bytes_out += message.numel()
        self.bytes_in += reply.numel()
        state.estimate += state.inbox.decode(reply)
        average = (snap + state.estimate) / 2
        self._clamp(average)
        scatter_add(self.flat, self.segments, average - snap)

    def _clamp(self, values: Tensor) -> None:
        offset = 0
        for seg in self.segments:
            if seg.tensor in self.shared.nonnegative:
                values[offset : offset + seg.size].clamp_min_(0)
            offset += seg.size

    def _exact_mean(self) -> None:
        owners = self.plan.active_servers
        snaps = {s: gather(self.flat, self.plan.segments[s]) for s in owners}
        sums = self.exact.reduce(snaps)
        world = len(self.env.trainers)
        for s in owners:
            scatter_copy(self.flat, self.plan.segments[s], sums[s] / world)
        if self.rows is not None:
            self.rows.agree()

    # ------------------------------------------------------------------ hooks
    def start(self) -> None:
        self.rounds_thread.start()

    def bucket_started(self) -> None:
        self.rounds_thread.set_training(True)

    def bucket_finished(self) -> None:
        self.rounds_thread.set_training(False)

    def flush(self, timeout: float) -> None:
        self.rounds_thread.flush(timeout)

    def agree(self, timeout: float) -> None:
        self.rounds_thread.agree(timeout)

    def stop(self) -> None:
        self.rounds_thread.stop(timeout=30)

    @property
    def rounds(self) -> int:
        return self.rounds_thread.data_rounds

    @property
    def bytes_sent(self) -> int:
        rows = self.rows.bytes_sent if self.rows else 0
        return self.bytes_out + self.exact.bytes_sent + rows

    @property
    def bytes_received(self) -> int:
        rows = self.rows.bytes_received if self.rows else 0
        return self.bytes_in + self.exact.bytes_received + rows
