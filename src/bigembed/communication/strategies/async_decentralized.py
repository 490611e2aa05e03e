"""``async_decentralized``: no central party, asynchronous. A background thread averages this
trainer's shared parameters with whichever peer is ready at the same time; the workers never
wait.

Every ``sync_interval`` seconds at most (longer when its meetings would take more than a tenth
of a core: :data:`~bigembed.communication.sharer.MAX_CPU_SHARE`) the gossip thread asks the
rendezvous store for a partner (:class:`~bigembed.communication.gossip.PairingBoard`: a peer
whose thread is ready too, or nobody within ``max(sync_interval, 50 ms)``, and then it tries
again later). Two paired trainers swap their values and both continue from the average, keeping
what their workers changed meanwhile, exactly as a round of ``decentralized`` does, with the
same low-precision CHOCO-gossip scheme (per peer, the copies ``known_by`` and ``estimate``, and
the difference sent in the configured precision). Unlike ``decentralized`` there is no round
common to everybody: a slow trainer only misses meetings, it never holds anybody up.

At a checkpoint (:meth:`agree`) the thread pauses after its current meeting and the trainers
compute the exact fp32 mean of everybody's values (a reduce-scatter and all-gather over all
trainers, as ``decentralized`` does), so a checkpoint holds one agreed value. A peer that
dies during a meeting fails it within ``distributed_timeout`` (gloo's or the store's timeout),
reported through ``on_error``; a dead peer nobody meets is the watchdog's to report.

The pairing's store keys are named after the strategy's instance number in this process: every
trainer creates its strategies in the same order.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from torch import Tensor

from bigembed.communication.codecs import get_codec
from bigembed.communication.gossip import PairingBoard
from bigembed.communication.param_server import (
    Segment,
    ShardPlan,
    gather,
    scatter_add,
    scatter_copy,
)
from bigembed.communication.primitives import TAG_GOSSIP, ShardedReduce, exchange
from bigembed.communication.sharer import cpu_paced
from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv
from bigembed.communication.strategies.decentralized import _Peer

_INSTANCES = itertools.count()
MIN_PATIENCE_S = 0.05


class AsyncDecentralized(Strategy):
    centralized = False
    synchronous = False

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        super().__init__(env, shared)
        if env.store_client is None:
            raise ValueError("async_decentralized pairs trainers through the rendezvous store")
        self.flat = shared.flat
        self.segments = [Segment(i, 0, n) for i, n in enumerate(shared.numels) if n > 0]
        self.sizes = [seg.size for seg in self.segments]
        self.initial = gather(self.flat, self.segments)  # every trainer holds rank 0's values
        self.peers: dict[int, _Peer] = {}
        self.meetings = 0
        self.bytes_out = 0
        self.bytes_in = 0
        self.plan = ShardPlan(shared.names, shared.numels, env.trainers, shared.nonnegative)
        self.exact = ShardedReduce(env.rank, self.plan, get_codec("fp32"), env.group, env.trainers)
        patience = max(env.sync_interval, MIN_PATIENCE_S)
        prefix = f"gossip/{next(_INSTANCES)}"
        self.board = PairingBoard(env.store_client(), prefix, env.rank, patience)
        self._cond = threading.Condition()
        self._agreeing = False  # agree() runs: no new meeting
        self._resting = False  # agreed, no bucket since: the agreed values stay as they are
        self._busy = False
        self._stop = False
        self._started = 0  # pairing attempts started, and finished
        self._done = 0
        self._failed: str | None = None
        self._gap = env.sync_interval  # least seconds between two attempts (CPU-capped)
        self._thread = threading.Thread(target=self._run, name="bigembed-gossip", daemon=True)

    # ------------------------------------------------------------------ the thread
    def _may_try(self, last: float) -> bool:
        if self._agreeing or self._resting:
            return False
        return time.monotonic() - last >= self._gap

    def _run(self) -> None:
        try:
            last = -float("inf")
            while True:
                with self._cond:
                    while not self._stop and not self._may_try(last):
                        self._cond.wait(self._gap / 2)
                    if self._stop:
                        return
                    self._busy = True
                    self._started += 1
                last, cpu = time.monotonic(), time.thread_time()
                peer = self.board.try_pair()
                if peer is not None:
                    self._meet(peer)
                self._gap = cpu_paced(self.env.sync_interval, time.thread_time() - cpu)
                with self._cond:
                    self._busy = False
                    self._done += 1
                    self._cond.notify_all()
        except Exception as exc:  # reported to the watchdog, which stops the run
            with self._cond:
                self._failed = str(exc)
                self._busy = False
                self._cond.notify_all()
            self.env.on_error(f"{self._thread.name} on rank {self.env.rank} failed: {exc}")

    def _meet(self, peer: int) -> None:
        """Swap values with ``peer`` (CHOCO differences) and move to the average."""
        state = self.peers.get(peer)
        if state is None:
            state = self.peers[peer] = _Peer(self.initial, self.sizes, self.env)
        snap = gather(self.flat, self.segments)
        message = state.outbox.encode(snap - state.known_by)
        state.known_by += state.outbox.decode(message)
        reply = state.inbox.empty()
        exchange({peer: message}, {peer: reply}, self.env.group, TAG_GOSSIP)
        self.bytes_out += message.numel()
        self.bytes_in += reply.numel()
        state.estimate += state.inbox.decode(reply)
        average = (snap + state.estimate) / 2
        self._clamp(average)
        scatter_add(self.flat, self.segments, average - snap)
        self.meetings += 1

    def _clamp(self, values: Tensor) -> None:
        offset = 0
        for seg in self.segments:
            if seg.tensor in self.shared.nonnegative:
                values[offset : offset + seg.size].clamp_min_(0)
            offset += seg.size

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (lock held) until ``done()``; a failed thread or the timeout raises."""
        deadline = time.monotonic() + timeout
        while not done():
            if self._failed is not None:
                raise TimeoutError(f"the gossip thread failed before the {what}: {self._failed}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout:g}s")
            self._cond.wait(min(left, 0.5))
        if self._failed is not None:
            raise TimeoutError(f"the gossip thread failed before the {what}: {self._failed}")

    # ------------------------------------------------------------------ hooks
    def start(self) -> None:
        self._thread.start()

    def bucket_started(self) -> None:
        with self._cond:
            self._resting = False
            self._cond.notify_all()

    def flush(self, timeout: float) -> None:
        """Give this trainer's latest changes a chance to go out: wait for a pairing attempt
        that starts after this call (nobody may be free: :meth:`agree` is the exact step)."""
        with self._cond:
            goal = self._started + 1
            self._wait(lambda: self._resting or self._done >= goal, timeout, "flush")

    def agree(self, timeout: float) -> None:
        """The exact mean over all trainers, after the current meeting (every trainer calls it
        after the checkpoint's barrier, while no worker trains). No meeting follows until the
        next bucket starts, so the agreed values stay as they are for the checkpoint."""
        with self._cond:
            self._agreeing = True
            self._cond.notify_all()
            try:
                self._wait(lambda: not self._busy, timeout, "agreement")
            except TimeoutError:
                self._agreeing = False
                raise
        try:
            owners = self.plan.active_servers
            snaps = {s: gather(self.flat, self.plan.segments[s]) for s in owners}
            sums = self.exact.reduce(snaps)
            world = len(self.env.trainers)
            for s in owners:
                scatter_copy(self.flat, self.plan.segments[s], sums[s] / world)
        except RuntimeError as exc:  # gloo: a peer died or timed out
            first = str(exc).strip().splitlines()[0]
            raise TimeoutError(f"the agreement failed: {first}") from None
        finally:
            with self._cond:
                self._agreeing = False
                self._resting = True
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def rounds(self) -> int:
        return self.meetings

    @property
    def bytes_sent(self) -> int:
        return self.bytes_out + self.exact.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.bytes_in + self.exact.bytes_received
