"""The round thread of the collective strategies: every trainer runs round k together.

Each trainer runs one thread. A round starts with a header every trainer sends every other
(:func:`~bigembed.communication.primitives.flags_exchange`): its new batches since its last
round, and whether it asks to flush, to agree or to stop. The summed header decides, the same
way on every trainer, what the round does:

* every trainer asks to stop: the round is the last one;
* every trainer asks to agree: the strategy's agreement (``on_agree``), after which the
  trainers hold the same values;
* anybody has new batches or asks to flush: a data round (``on_data``);
* otherwise nothing but the header (idle trainers do not ship unchanged parameters).

When a trainer's thread enters a round:

* gated (a synchronous strategy) while its workers train a bucket: once they have used their
  budget of ``sync_every`` batches (they wait at the gate meanwhile), or the bucket ends;
* otherwise: ``sync_interval`` seconds after its previous round started, or later when the
  previous round's CPU time would make the thread take more than a tenth of a core
  (:data:`~bigembed.communication.sharer.MAX_CPU_SHARE`, the rule of every round thread).

A flush, agree or stop request cuts the wait short. A trainer that is not training keeps
entering rounds, so a trainer whose workers wait at the gate never waits for an idle one. The
budget after a round is the batch count at its start plus ``sync_every``: the workers never
run more than ``sync_every`` batches (plus one per worker, see the gate) past the values the
last completed round merged.

**Overlap** (``communication.overlap``): a round that starts because this trainer's workers used
their budget opens the gate for the next budget at once, before the header exchange, so the
workers train the next ``sync_every`` batches while the round waits for slower trainers and
while it communicates; their changes stay in the live tensors (a round's snapshot may include
some of them, the rest go out with the next round). Any other round opens it when the strategy
calls :meth:`LockstepRounds.snapshot_taken` (once it has read the values it sends). One round
of staleness: the next round cannot start before this one completed, so the workers never run
more than ``2 x sync_every`` batches (plus one per worker) past the values the last completed
round merged. Without overlap a trainer ahead of the others waits at the gate until the
slowest has caught up and the round has merged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from bigembed.communication.primitives import flags_exchange
from bigembed.communication.sharer import cpu_paced
from bigembed.train import BatchGate

_FLAG_BATCHES, _FLAG_FLUSH, _FLAG_AGREE, _FLAG_STOP = range(4)
_POLL_S = 0.001  # the finest the round thread checks its gate
_MAX_PAUSE_S = 0.05  # the longest it sleeps while its workers train


class GatePace:
    """How long a round thread may sleep before its workers can have used their budget.

    The round thread cannot be woken by the workers (they are other processes, or the main
    thread at full speed), so it looks at the gate. Looking every millisecond costs a thread
    wake-up, and with one worker the GIL, a thousand times a second; instead it sleeps half the
    time the batches left in the budget take at the pace the workers have trained since the
    last round ended (the previous round's pace until a batch is done): a few looks per round,
    and the last ones as fine as ``_POLL_S``.
    """

    def __init__(self) -> None:
        self.seconds_per_batch: float | None = None
        self._since: tuple[float, int] | None = None  # (time, batches) at the last round's end

    def restart(self, batches: int) -> None:
        """A round ended with ``batches`` done: measure the pace from here."""
        self._since = (time.monotonic(), batches)

    def pause(self, batches: int, budget: int) -> float:
        """Seconds to sleep with ``batches`` done of ``budget``."""
        if self._since is None or batches < self._since[1]:
            self.restart(batches)
        start, done = self._since  # type: ignore[misc]
        if batches > done:
            self.seconds_per_batch = (time.monotonic() - start) / (batches - done)
        if self.seconds_per_batch is None:
            return _POLL_S
        wanted = 0.5 * (budget - batches) * self.seconds_per_batch
        return min(_MAX_PAUSE_S, max(_POLL_S, wanted))


class LockstepRounds:
    """One trainer's round thread (see the module docstring)."""

    def __init__(
        self,
        rank: int,
        trainers: Sequence[int],
        group: dist.ProcessGroup | None,
        gate: BatchGate,
        *,
        gated: bool,
        sync_every: int,
        interval: float,
        on_data: Callable[[], None],
        on_agree: Callable[[], None],
        on_error: Callable[[str], None],
        name: str,
        overlap: bool = False,
    ) -> None:
        self.rank = rank
        self.peers = [t for t in trainers if t != rank]
        self.world = len(trainers)
        self.group = group
        self.gate = gate
        self.gated = gated
        self.sync_every = sync_every
        self.interval = interval
        self.on_data = on_data
        self.on_agree = on_agree
        self.on_error = on_error
        self.overlap = overlap and gated
        self._round_batches = 0  # the batch count at the start of the round in flight
        self.data_rounds = 0
        self.header_rounds = 0
        self._counted = 0  # batches of this trainer already announced
        self._completed_batches = 0  # its batch count when the last completed round started
        self._training = False
        self._flush_goal = 0  # data rounds requested (flush)
        self._agree_asked = False
        self._stop_asked = False
        self._started = 0
        self._completed = 0
        self._agreements = 0
        self._failed: str | None = None
        self._cond = threading.Condition()
        self._pace = GatePace()
        #: least seconds between two rounds not driven by the gate: ``interval``, or more when
        #: the last round's CPU would exceed a tenth of a core (sharer.cpu_paced)
        self._gap = interval
        self._thread = threading.Thread(target=self._run, name=f"bigembed-{name}", daemon=True)
        if gated:  # a gate may come from an earlier strategy of the run: count from its total
            gate.allow(gate.batches() + sync_every)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def set_training(self, training: bool) -> None:
        with self._cond:
            self._training = training
            self._cond.notify_all()

    def flush(self, timeout: float) -> None:
        """Wait for a data round that started after this call."""
        with self._cond:
            goal = self._started + 1
            self._flush_goal = max(self._flush_goal, goal)
            self._cond.notify_all()
            self._wait(lambda: self._completed >= goal, timeout, "flush")

    def agree(self, timeout: float) -> None:
        """Ask for an agreement round; returns once every trainer asked and it ran."""
        with self._cond:
            goal = self._agreements + 1
            self._agree_asked = True
            self._cond.notify_all()
            self._wait(lambda: self._agreements >= goal, timeout, "agreement")

    def stop(self, timeout: float) -> None:
        """Leave after the round in which every trainer asked to stop."""
        with self._cond:
            self._stop_asked = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout)

    def snapshot_taken(self) -> None:
        """Called by a data round once it has read the values it sends: with overlap, the
        workers may train the next ``sync_every`` batches while it communicates."""
        if self.overlap:
            self.gate.allow(self._round_batches + self.sync_every)

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if self._failed is not None:
                raise TimeoutError(f"the round thread failed before the {what}: {self._failed}")
            if left <= 0 or not self._thread.is_alive():
                raise TimeoutError(f"no {what} round within {timeout:g}s")
            self._cond.wait(min(left, 0.5))

    # ------------------------------------------------------------------ the thread
    def _due(self, last_start: float) -> bool:
        """Whether this trainer should enter the next round now (lock held)."""
        if self._stop_asked or self._agree_asked or self._flush_goal > self._started:
            return True
        if self.gated and self._training:
            return self.gate.full()
        return time.monotonic() - last_start >= self._gap

    def _pause(self, last_start: float) -> float:
        """How long the thread may sleep before :meth:`_due` can turn true by itself (lock
        held; requests notify the condition and cut the sleep short)."""
        if self.gated and self._training:
            return self._pace.pause(self.gate.batches(), int(self.gate.budget[0]))
        return max(_POLL_S, self._gap - (time.monotonic() - last_start))

    def _run(self) -> None:
        try:
            last_start = 0.0
            while True:
                with self._cond:
                    while not self._due(last_start):
                        self._cond.wait(self._pause(last_start))
                    self._started += 1
                    flush = self._flush_goal >= self._started
                    # due because the workers used their budget: with overlap they go on while
                    # the round waits for the others (see the module docstring)
                    by_budget = self._training and not (
                        flush or self._agree_asked or self._stop_asked
                    )
                    early = self.overlap and by_budget
                    # without overlap the gate stays closed while the header waits for the
                    # others: that wait is the workers' too (BatchGate.peer_waited)
                    gate_closed = self.gated and by_budget and not early
                    header = torch.tensor(
                        [0, int(flush), int(self._agree_asked), int(self._stop_asked)],
                        dtype=torch.int64,
                    )
                last_start, cpu = time.monotonic(), time.thread_time()
                batches = self._round_batches = self.gate.batches()
                if early:
                    self.gate.allow(batches + self.sync_every)
                header[_FLAG_BATCHES] = batches - self._counted
                self._counted = batches
                exchange_start = time.perf_counter()
                total = flags_exchange(header, self.peers, self.group)
                if gate_closed:
                    self.gate.add_peer_wait(time.perf_counter() - exchange_start)
                agreed = False
                if int(total[_FLAG_AGREE]) == self.world:
                    self.on_agree()
                    agreed = True
                elif int(total[_FLAG_BATCHES]) > 0 or int(total[_FLAG_FLUSH]) > 0:
                    self.on_data()
                    self.data_rounds += 1
                else:
                    self.header_rounds += 1
                self._gap = cpu_paced(self.interval, time.thread_time() - cpu)
                with self._cond:
                    self._completed = self._started
                    self._completed_batches = batches
                    if agreed:
                        self._agreements += 1
                        self._agree_asked = False
                    self._cond.notify_all()
                # Only now open the gate: a worker let through sees this round as completed
                # (were it opened first, a worker could read the previous round's batch count).
                if self.gated:
                    self.gate.allow(batches + self.sync_every)
                    self._pace.restart(self.gate.batches())
                if int(total[_FLAG_STOP]) == self.world:
                    return
        except Exception as exc:  # reported to the watchdog, which stops the run
            self._failed = str(exc)
            with self._cond:
                self._cond.notify_all()
            self.on_error(f"{self._thread.name} on rank {self.rank} failed: {exc}")
