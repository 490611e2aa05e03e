"""The sharer loop: keeps a trainer's copy of the shared parameters in step with the servers.

Each round, for every parameter server: take a snapshot of the segments it holds, send
``snapshot - last merged value`` (what this trainer changed since), receive the new merged value
``m`` and add ``m - snapshot`` to the live tensors. Updates the Hogwild workers make while the
round is in flight are kept (they are neither in the snapshot nor overwritten), and the next
delta carries them. Live tensors are touched through ``.data``, so autograd never sees it.

With a lossy ``communication.precision`` the exchange with a remote server carries changes
only, both ways: the delta is encoded with the codec and this trainer's error feedback (one per
server and segment: :class:`~bigembed.communication.segment_stream.SegmentStream`, so a
quantization chunk never mixes two tensors), and the server replies with its value's change
since its previous reply to this trainer (encoded the same way with its own error feedback),
which the trainer adds to ``last`` (its copy of the server's value). Both directions then cost
the codec's bytes, and no error is lost: each side's residual goes out with its next message.
The values a trainer holds still differ from the exact sums by up to one message's error, and
for an Adagrad accumulator near 0 that error can be negative: the segments the plan marks
``nonnegative`` are clamped at 0 after each round (the clamp is a change like any other, so
the next delta carries it to the server). ``fp32`` keeps the exact exchange above (the merged
value itself), bit for bit, and never clamps. The local server is always exact (no network).

Rounds are throttled as PBG documents it: at most 100 per second, and at most 1 GB/s of traffic
(:class:`Pacer`, which takes its clock as a parameter so tests can drive it); and, beyond PBG,
at most ``MAX_CPU_SHARE`` of a core: the round thread shares the trainer's cores with the
training step, and rounds of a large shared set (a few hundred relation operators with their
Adagrad state, hundreds of kB dense) 100 times a second would take a large share of a core
from a rank with one worker for no gain in freshness that training can use.
:meth:`Sharer.flush` waits for a round that starts after the call, which is how the end of a
step pushes everything (and, after a barrier, pulls everything) before a checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication import Codec, get_codec
from bigembed.communication.param_server import (
    OP_BYE,
    OP_PUSH_PULL,
    TAG_DELTA,
    TAG_HEADER,
    TAG_VALUE,
    ParameterServer,
    ShardPlan,
    gather,
    scatter_add,
)
from bigembed.communication.segment_stream import SegmentStream

MAX_ROUNDS_PER_S = 100.0
MAX_BYTES_PER_S = 1e9
#: The most of one core the round thread's own CPU time may take (its rounds' CPU seconds over
#: the time from one round's start to the next).
MAX_CPU_SHARE = 0.1


def cpu_paced(interval: float, cpu_seconds: float) -> float:
    """The least seconds from a round's start to the next one's: ``interval``, or longer when
    the round's ``cpu_seconds`` would make its thread take more than ``MAX_CPU_SHARE`` of a
    core (the rule of every round thread: this Pacer, ``LockstepRounds``' interval rounds,
    ``async_decentralized``'s meetings)."""
    return max(interval, cpu_seconds / MAX_CPU_SHARE)


class Pacer:
    """How long to pause after a round so that rounds stay under both caps."""

    def __init__(
        self,
        max_rounds_per_s: float = MAX_ROUNDS_PER_S,
        max_bytes_per_s: float = MAX_BYTES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_interval = 1.0 / max_rounds_per_s
        self.max_bytes_per_s = max_bytes_per_s
        self.clock = clock

    def pause(self, began: float, nbytes: int, cpu_seconds: float = 0.0) -> float:
        """Seconds to wait after a round that started at ``began`` (this clock), moved
        ``nbytes`` and took ``cpu_seconds`` of its thread's CPU time: the round plus the pause
        last at least the longest of the three intervals (rounds, bytes, CPU share)."""
        interval = cpu_paced(max(self.min_interval, nbytes / self.max_bytes_per_s), cpu_seconds)
        return max(0.0, interval - (self.clock() - began))


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class Sharer:
    def __init__(
        self,
        rank: int,
        plan: ShardPlan,
        tensors: Sequence[Tensor],
        local: ParameterServer,
        group: dist.ProcessGroup | None,
        on_error: Callable[[str], None],
        max_rounds_per_s: float = MAX_ROUNDS_PER_S,
        max_bytes_per_s: float = MAX_BYTES_PER_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        codec: Codec | None = None,
    ) -> None:
        self.rank = rank
        self.codec = codec or get_codec("fp32")
        self.plan = plan
        self.flat = [t.data.view(-1) for t in tensors]
        self.local = local
        self.group = group
        self.on_error = on_error
        self.pacer = Pacer(max_rounds_per_s, max_bytes_per_s, clock)
        self._sleep = sleep or self._rest
        self.servers = plan.active_servers
        self.last = {s: gather(self.flat, plan.segments[s]) for s in self.servers}
        self.lossy = not self.codec.lossless
        remote = [s for s in self.servers if s != rank] if self.lossy else []
        sizes = {s: [seg.size for seg in plan.segments[s]] for s in remote}
        # lossy codecs: per remote server, the deltas sent and the replies received
        self.outbox = {s: SegmentStream(self.codec, sizes[s]) for s in remote}
        self.inbox = {s: SegmentStream(self.codec, sizes[s]) for s in remote}
        self.clamped = [
            seg for s in self.servers for seg in plan.segments[s] if seg.tensor in plan.nonnegative
        ]
        self.bytes_sent = 0
        self.bytes_received = 0
        self.rounds = 0
        self._started = 0
        self._completed = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bigembed-sharer", daemon=True)

    def start(self) -> None:
        if self.servers:
            self._thread.start()

    # ------------------------------------------------------------------ rounds
    def _round(self) -> int:
        """One push/pull with every server; returns the bytes it moved over the network."""
        moved = 0
        header = torch.tensor([OP_PUSH_PULL, 0], dtype=torch.int64)
        pending = []
        for server in self.servers:
            segments = self.plan.segments[server]
            snap = gather(self.flat, segments)
            delta = snap - self.last[server]
            if server == self.rank:
                merged = self.local.push_pull(delta)
                scatter_add(self.flat, segments, merged - snap)
                self.last[server] = merged
                continue
            if self.lossy:
                message = self.outbox[server].encode(delta)
                reply = self.inbox[server].empty()
            else:
                message = self.codec.encode(delta).wire()
                reply = self.codec.empty(delta.numel()).wire()
            dist.send(header, dst=server, group=self.group, tag=TAG_HEADER)
            sent = dist.isend(message, dst=server, group=self.group, tag=TAG_DELTA)
            received = dist.irecv(reply, src=server, group=self.group, tag=TAG_VALUE)
            # None only for a rank outside the group; every server and this rank are in it
            assert sent is not None and received is not None
            pending.append((server, segments, snap, reply, sent, received))
            self.bytes_sent += _nbytes(message)
            moved += _nbytes(message)
        for server, segments, snap, reply, sent, received in pending:
            sent.wait()
            received.wait()
            # lossy: the reply is the server value's change since its previous reply to us
            merged = self.last[server] + self.inbox[server].decode(reply) if self.lossy else reply
            scatter_add(self.flat, segments, merged - snap)
            self.last[server] = merged
            self.bytes_received += _nbytes(reply)
            moved += _nbytes(reply)
        if self.lossy:
            # An Adagrad accumulator is a sum of squares; its lossy copy may land a little
            # below 0 near 0, and sqrt of a negative accumulator is NaN. Clamping is a change
            # of the live tensor, so the next delta carries it to the server like any update.
            for seg in self.clamped:
                self.flat[seg.tensor][seg.start : seg.end].clamp_min_(0)
        self.rounds += 1
        return moved

    def _rest(self, seconds: float) -> None:
        """Pause between rounds; a flush cuts it short."""
        self._wake.wait(seconds)
        self._wake.clear()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    self._started += 1
                began, cpu = self.pacer.clock(), time.thread_time()
                moved = self._round()
                with self._cond:
                    self._completed = self._started
                    self._cond.notify_all()
                rest = self.pacer.pause(began, moved, time.thread_time() - cpu)
                if rest > 0:
                    self._sleep(rest)
            for server in self.servers:
                if server != self.rank:
                    bye = torch.tensor([OP_BYE, 0], dtype=torch.int64)
                    dist.send(bye, dst=server, group=self.group, tag=TAG_HEADER)
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"sharer on rank {self.rank} failed: {exc}")

    def flush(self, timeout: float) -> None:
        """Wait for a complete round that started after this call (no-op without servers)."""
        if not self.servers:
            return
        with self._cond:
            goal = self._started + 1
            self._wake.set()
            deadline = time.monotonic() + timeout
            while self._completed < goal:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise TimeoutError(f"the sharer loop made no round within {timeout:g}s")
                self._cond.wait(min(left, 0.5))

    def stop(self) -> None:
        """End the loop; tells every remote server goodbye."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
