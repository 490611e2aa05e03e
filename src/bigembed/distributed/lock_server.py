"""The lock server (rank 0): which trainer trains which bucket, so no partition is held twice.

Rules, per pass (one (epoch, edge set, chunk) step):

* a trainer is granted a bucket none of whose partitions another trainer holds (its own, kept
  from its previous bucket, are fine) and that nobody has trained in this pass;
* which of those, the *grant policy* (config ``load_balancing``) decides:

  - ``pbg`` (PBG's behaviour, kept for comparison): the ones sharing the most partitions with
    what it holds (fewer transfers), then the largest by edge count, then the smallest (i, j);
  - ``cost`` (the default): the bucket whose partitions carry the most remaining cost (the sum,
    over its partitions, of the cost of the buckets not yet granted that use them), then the
    costliest bucket, then affinity, then the smallest (i, j). No two trainers can use a
    partition at once, so a partition's remaining cost is a lower bound on the time left in the
    pass: serving the busiest partitions first keeps that bound from becoming the tail, and
    among them the costliest bucket first is Bagua's "largest first" balancing, by cost (see
    :mod:`bigembed.train.memory.cost`) rather than by edge count;
* with ``distributed_tree_init_order``, in the first pass of a fresh run a bucket is granted only
  if all its lhs or all its rhs partitions were touched already, starting from partition 0 of
  each type, so every partition's random start is first trained next to an already aligned
  one (if nothing in flight could ever satisfy the rule, it is waived rather than deadlock);
* nothing grantable: "wait" (the trainer writes its partitions back, releases them and asks
  again); nothing left to grant: "done".

Look-ahead (``want: 2``, config ``partition_prefetch``): a trainer may hold one bucket beyond the
one it trains, so it can read that bucket's partitions while it trains the current one. Each
``acquire`` reports the bucket just trained (``finished``) and asks to hold ``want`` buckets; the
server grants up to that many (same rules, plus: no look-ahead grant while the buckets left are
no more than the trainers without work, and none using a new partition while another trainer
waits; a trainer never *waits* while it still has a bucket:
"wait" and "done" only come with nothing to train). The reply lists the new grants
(``granted``) and the partitions the trainer must give back (``release``: everything it holds
that none of its buckets uses).

Giving back is two-phase so that write-back can run in the background: a partition listed in
``release`` is *returning*: still owned by the trainer (nobody else can be granted it), but no
longer usable by it either (no grant counts on it), until the trainer's ``release`` request, sent
once the write-back is complete (to a partition server or the checkpoint directory), frees it.
So nobody can read a stale copy, and a trainer never trains a partition it is still writing
back. Every decision is appended to an event log (JSON lines) that tests replay to prove the
no-shared-partition rule from what actually happened.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch.distributed as dist

from bigembed.distributed.auth import Session
from bigembed.distributed.rpc import BadRequest, Message, RpcServer, field
from bigembed.partition_keys import Bucket, PartitionKey

logger = logging.getLogger(__name__)

SideKeys = tuple[frozenset[PartitionKey], frozenset[PartitionKey]]
CHANNEL = "lock"


#: The grant policies (config ``load_balancing``).
POLICIES = ("cost", "pbg")


@dataclass(frozen=True)
class PassPlan:
    """The buckets of one pass with their edge counts in this pass's chunk (which may be 0)
    and, for the ``cost`` policy, their costs (``None``: the edge counts are the costs)."""

    iteration: int
    weights: dict[Bucket, int]
    tree_init: bool
    costs: dict[Bucket, float] | None = None

    def cost(self, bucket: Bucket) -> float:
        return float(self.weights[bucket] if self.costs is None else self.costs[bucket])


class EventLog:
    """Append-only JSON lines, one per lock decision, flushed as they happen."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._seq = 0
        self._lock = threading.Lock()  # a trainer's transfer log is written from I/O threads
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._seq += 1
            if self._file is None:
                return
            record = {"event": event, "seq": self._seq, "time": time.time(), **fields}
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _keys_json(keys: set[PartitionKey] | frozenset[PartitionKey]) -> list[list[Any]]:
    return [[t, p] for t, p in sorted(keys)]


class BucketScheduler:
    """The lock server's state machine; no I/O apart from the event log."""

    def __init__(
        self,
        keys_of: Callable[[Bucket], SideKeys],
        plan_for: Callable[[int], PassPlan],
        log: EventLog | None = None,
        policy: str = "pbg",
        trainers: int | None = None,
    ) -> None:
        """``trainers``: how many trainers the run has (look-ahead leaves a bucket for each
        one without work; None: the trainers seen so far)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown grant policy {policy!r} (expected one of {POLICIES})")
        self.policy = policy
        self.trainers = trainers
        self.keys_of = keys_of
        self.plan_for = plan_for
        self.log = log or EventLog(None)
        self.iteration = -1
        self.plan: PassPlan | None = None
        self.pending: set[Bucket] = set()
        self.done: set[Bucket] = set()
        self.active: dict[int, list[Bucket]] = {}  # granted, not finished: training first
        self.owner: dict[PartitionKey, int] = {}
        self.held: dict[int, set[PartitionKey]] = {}  # owned and usable by the trainer
        self.returning: dict[int, set[PartitionKey]] = {}  # owned, being written back
        self.waiting: set[int] = set()  # trainers whose last answer was "wait"
        self.touched: set[PartitionKey] | None = None
        self.load: dict[PartitionKey, float] = {}  # remaining cost per partition (cost policy)

    def _all_keys(self, bucket: Bucket) -> frozenset[PartitionKey]:
        lhs, rhs = self.keys_of(bucket)
        return lhs | rhs

    # ------------------------------------------------------------------ passes
    def _enter(self, iteration: int) -> None:
        if iteration == self.iteration:
            return
        if iteration < self.iteration:
            raise ValueError(
                f"iteration {iteration} is over (the lock server is at {self.iteration})"
            )
        if self.iteration >= 0 and (self.pending or self._in_flight()):
            raise ValueError(
                f"iteration {iteration} requested while iteration {self.iteration} still has "
                f"{len(self.pending)} buckets to hand out and {self._in_flight()} in training"
            )
        if self.owner:
            raise ValueError(f"partitions still held at the start of a pass: {sorted(self.owner)}")
        plan = self.plan_for(iteration)
        self.plan = plan
        self.iteration = iteration
        self.pending = set(plan.weights)
        self.done = set()
        self.active = {}
        self.touched = None
        self.load = {}
        for b in self.pending:
            for k in self._all_keys(b):
                self.load[k] = self.load.get(k, 0.0) + plan.cost(b)
        if plan.tree_init:
            self.touched = {k for b in self.pending for k in self._all_keys(b) if k[1] == 0}
        self.log.write(
            "pass_start", iteration=iteration, buckets=len(self.pending), tree_init=plan.tree_init
        )

    def _tree_ok(self, bucket: Bucket) -> bool:
        if self.touched is None:
            return True
        lhs, rhs = self.keys_of(bucket)
        return lhs <= self.touched or rhs <= self.touched

    def _in_flight(self) -> int:
        return sum(len(b) for b in self.active.values())

    def _using(self, trainer: int) -> set[PartitionKey]:
        """The partitions of the trainer's granted, unfinished buckets."""
        out: set[PartitionKey] = set()
        for b in self.active.get(trainer, []):
            out |= self._all_keys(b)
        return out

    # ------------------------------------------------------------------ requests
    def acquire(
        self, trainer: int, iteration: int, finished: Bucket | None, want: int = 1
    ) -> Message:
        """``finished``: the bucket the trainer just trained (its oldest grant); ``want``: how
        many buckets it asks to hold after this call (1, or 2 with look-ahead)."""
        self._enter(iteration)
        assert self.plan is not None
        if want not in (1, 2):
            raise ValueError(f"trainer {trainer} asks to hold {want} buckets (1 or 2)")
        held = self.held.setdefault(trainer, set())
        mine = self.active.setdefault(trainer, [])
        if finished is not None:
            if not mine or mine[0] != finished:
                raise ValueError(f"trainer {trainer} reports bucket {finished} it was not given")
            mine.pop(0)
            self.done.add(finished)
            self.log.write(
                "bucket_done", trainer=trainer, iteration=iteration, bucket=list(finished)
            )
            if not self.pending and not self._in_flight():
                self.log.write("pass_done", iteration=iteration, buckets=len(self.done))
        if len(mine) >= want:
            raise ValueError(
                f"trainer {trainer} asks for a bucket while holding {mine[0]}"
                + (f" and {mine[1]}" if len(mine) > 1 else "")
            )
        granted: list[Bucket] = []
        while len(mine) < want:
            best = self._grant(trainer, iteration, held, ahead=bool(mine))
            if best is None:
                break
            mine.append(best)
            granted.append(best)
        give_back = held - self._using(trainer)
        held -= give_back
        self.returning.setdefault(trainer, set()).update(give_back)
        reply: Message = {
            "granted": [list(b) for b in granted],
            "release": _keys_json(give_back),
        }
        self.waiting.discard(trainer)
        if mine:
            reply["kind"] = "bucket"
            if granted:
                reply["bucket"] = list(granted[0])
        elif not self.pending:
            self.log.write("done", trainer=trainer, iteration=iteration)
            reply["kind"] = "done"
        else:
            self.log.write("wait", trainer=trainer, iteration=iteration)
            self.waiting.add(trainer)
            reply["kind"] = "wait"
        return reply

    def _grant(
        self, trainer: int, iteration: int, held: set[PartitionKey], ahead: bool
    ) -> Bucket | None:
        """Grant the trainer the best allowed bucket (None: nothing allowed now). A partition
        is allowed if nobody owns it or the trainer owns it *and may use it* (not returning).

        A look-ahead grant (``ahead``: the trainer still has a bucket to train) must not starve
        the others: it is made only while more buckets are left than trainers without work
        (each may still ask), and while another trainer waits, it may only use partitions the
        trainer's current bucket uses (no new lock); otherwise it follows the grant policy."""
        assert self.plan is not None
        if not self.pending:
            return None
        if ahead:
            known = self.trainers if self.trainers is not None else len(self.active)
            busy = sum(1 for t, b in self.active.items() if t != trainer and b)
            if len(self.pending) <= known - 1 - busy:
                return None
        free = [
            b
            for b in self.pending
            if all(k not in self.owner or k in held for k in self._all_keys(b))
        ]
        allowed = [b for b in free if self._tree_ok(b)]
        if not allowed and free and not self._in_flight():
            allowed = free  # nothing in flight could ever touch more partitions: waive the rule
        if ahead and self.waiting - {trainer}:
            using = self._using(trainer)
            allowed = [b for b in allowed if self._all_keys(b) <= using]
        if not allowed:
            return None
        best = min(allowed, key=lambda b: self._rank(b, held))
        keys = self._all_keys(best)
        self.pending.discard(best)
        for k in keys:
            self.load[k] -= self.plan.cost(best)
            self.owner[k] = trainer
        held |= keys
        if self.touched is not None:
            self.touched |= keys
        self.log.write(
            "acquire",
            trainer=trainer,
            iteration=iteration,
            bucket=list(best),
            partitions=_keys_json(keys),
            edges=self.plan.weights[best],
            cost=self.plan.cost(best),
            ahead=ahead,
        )
        return best

    def _rank(self, bucket: Bucket, held: set[PartitionKey]) -> tuple:
        """The grant policy: the allowed bucket with the smallest rank is granted."""
        assert self.plan is not None
        keys = self._all_keys(bucket)
        affinity = len(keys & held)
        if self.policy == "pbg":
            return (-affinity, -self.plan.weights[bucket], bucket)
        pressure = sum(self.load[k] for k in keys)
        return (-pressure, -self.plan.cost(bucket), -affinity, bucket)

    def release(self, trainer: int, iteration: int, keys: list[PartitionKey]) -> Message:
        """Free partitions the trainer has written back (never one its buckets still use)."""
        held = self.held.setdefault(trainer, set())
        returning = self.returning.setdefault(trainer, set())
        using = self._using(trainer)
        for key in keys:
            if self.owner.get(key) != trainer:
                raise ValueError(f"trainer {trainer} releases partition {key} it does not hold")
            if key in using:
                raise ValueError(
                    f"trainer {trainer} releases partition {key} that a bucket it was granted uses"
                )
        for key in keys:
            del self.owner[key]
            held.discard(key)
            returning.discard(key)
        self.log.write(
            "release", trainer=trainer, iteration=iteration, partitions=_keys_json(set(keys))
        )
        return {"ok": True}


class LockServer:
    """Serves a :class:`BucketScheduler` on the store channel ``lock`` (a thread on rank 0)."""

    def __init__(
        self,
        store: dist.Store,
        scheduler: BucketScheduler,
        on_error: Callable[[str], None],
        session: Session | None = None,
        trainers: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.trainers = trainers  # trainer ranks are 0..trainers-1 (None: not checked)
        self._lock = threading.Lock()
        self.rpc = RpcServer(
            store, CHANNEL, self._handle, on_error, poll=0.5, name="bigembed-lock", session=session
        )

    def start(self) -> None:
        self.rpc.start()

    def stop(self) -> None:
        self.rpc.stop()
        self.scheduler.log.close()

    def _handle(self, req: Message) -> Message:
        """Validate a request (a member trainer, well-formed, bounded), then decide."""
        op = field(req, "op", str, choices=("acquire", "release"))
        trainer = field(req, "trainer", int, low=0, high=self.trainers)
        iteration = field(req, "iteration", int, low=0, high=1 << 40)
        with self._lock:
            if op == "acquire":
                finished = None
                if req.get("finished") is not None:
                    pair = field(req, "finished", list, max_len=2)
                    finished = _bucket(pair)
                want = field(req, "want", int, low=1, high=3) if "want" in req else 1
                return self.scheduler.acquire(trainer, iteration, finished, want)
            keys = [_key(k) for k in field(req, "keys", list, max_len=1 << 16)]
            return self.scheduler.release(trainer, iteration, keys)


def _bucket(value: list[Any]) -> Bucket:
    if len(value) != 2 or not all(isinstance(x, int) and x >= 0 for x in value):
        raise BadRequest(f"bad bucket {str(value)[:80]!r}")
    return (value[0], value[1])


def _key(value: Any) -> PartitionKey:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or len(value[0]) > 256
        or not isinstance(value[1], int)
        or value[1] < 0
    ):
        raise BadRequest(f"bad partition key {str(value)[:80]!r}")
    return (value[0], value[1])
