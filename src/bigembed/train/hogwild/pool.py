"""Hogwild training of one bucket: worker processes update shared embeddings without locks.

A pool of ``workers`` processes (forked once per pool from a preloaded forkserver, one torch
thread each) receives, per bucket, the shared-memory tables and the shuffled edges (each object
sent once and then named by a token, see :mod:`bigembed.train.hogwild.cache`; the edges in
reused buffers, :mod:`bigembed.train.memory.edge_buffers`), trains its part of them, and reports
stats. How the edges are split (config ``load_balancing``):

* ``cost`` (work stealing): the trainer plans the bucket's batches once
  (:func:`~bigembed.buckets.batching.batch_plan`, PBG's batching rule over the whole bucket) and
  the workers take them one at a time from a shared counter until none is left, so a worker
  slowed down (by a costlier relation, a busy core, ``hogwild_delay``) simply takes fewer and
  nobody idles at the end of a bucket. Every batch is trained exactly once; each batch is drawn
  as before, so the loss per edge is the same in expectation;
* ``pbg``: each worker gets an even slice of the shuffled edges and batches it itself; the
  bucket ends when the slowest worker does.

The workers also rank the withheld-edge eval before and after each bucket
(:meth:`HogwildPool.run_eval`; PBG evaluates in its pool too): its units, one corrupted side of
one batch each, are taken from the same shared counter.

Progress is published through a small shared tensor so the parent can draw a live progress bar.
With one worker everything runs in the calling process. Workers die with the trainer, even one
killed while they start up (see :mod:`bigembed.train.hogwild.guard`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

from bigembed.buckets import Batch, batch_plan, make_batches, planned_batch
from bigembed.errors import BigembedError
from bigembed.kernels import BatchTrainer, NativeEval, StepStats, Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.partition_keys import PartitionKey
from bigembed.ranking import EvalPlan, UnitResult, eval_unit
from bigembed.train.hogwild.cache import Drop, Handle, SentObjects, WorkerCache
from bigembed.train.hogwild.gate import BatchGate
from bigembed.train.hogwild.guard import adopt_environment, worker_context, worker_entry
from bigembed.train.hogwild.malloc import keep_freed_memory
from bigembed.train.memory.edge_buffers import EdgeBuffer, EdgeBuffers, PreparedEdges

logger = logging.getLogger(__name__)


@dataclass
class BucketTask:
    """One worker's share of a bucket."""

    tables: dict[PartitionKey, Table]
    sides: list[tuple[PartitionKey, PartitionKey]]  # per relation idx: (lhs table, rhs table)
    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None
    start: int
    end: int
    seed: int
    delay: float = 0.0  # seconds to wait before starting (PBG's hogwild_delay)
    # Work stealing: the bucket's batch plan (see batch_plan) over edges already put in plan
    # order, so batch k is rows plan[k, 0]:plan[k, 1]; start/end are then unused. A small
    # array sent by value (one more shared-memory tensor per task costs more than it).
    plan: np.ndarray | None = None


@dataclass
class BucketMessage:
    """A :class:`BucketTask` as sent to a worker: the tables and the edge buffer as handles
    (see :mod:`bigembed.train.hogwild.cache`), the edges being the first ``count`` rows."""

    tables: dict[PartitionKey, Handle[Table]]
    sides: list[tuple[PartitionKey, PartitionKey]]
    edges: Handle[EdgeBuffer]
    count: int
    start: int
    end: int
    seed: int
    delay: float
    plan: np.ndarray | None

    def resolve(self, cache: WorkerCache) -> BucketTask:
        buf = cache.resolve(self.edges)
        n = self.count
        return BucketTask(
            {k: cache.resolve(h) for k, h in self.tables.items()},
            self.sides,
            buf.lhs[:n],
            buf.rhs[:n],
            buf.rel[:n],
            None if buf.weight is None else buf.weight[:n],
            self.start,
            self.end,
            self.seed,
            self.delay,
            self.plan,
        )


@dataclass
class EvalMessage:
    """An :class:`EvalTask` as sent to a worker (the tables as handles)."""

    tables: dict[PartitionKey, Handle[Table]]
    sides: list[tuple[PartitionKey, PartitionKey]]
    plan: EvalPlan
    workers: int

    def resolve(self, cache: WorkerCache) -> EvalTask:
        tables = {k: cache.resolve(h) for k, h in self.tables.items()}
        return EvalTask(tables, self.sides, self.plan, self.workers)


@dataclass
class EvalTask:
    """A withheld-edge eval for the workers: the units of ``plan`` (see
    :class:`~bigembed.ranking.sampled.EvalPlan`), taken from the batch queue (work
    stealing) or, without it, every ``workers``-th unit from the worker's rank."""

    tables: dict[PartitionKey, Table]
    sides: list[tuple[PartitionKey, PartitionKey]]
    plan: EvalPlan
    workers: int


def run_eval_task(
    setup: WorkerSetup, task: EvalTask, rank: int, batches: BatchQueue | None
) -> list[tuple[int, UnitResult]]:
    """The units this worker ranks, with their results."""
    n = task.plan.num_units
    units: Iterator[int] = (
        iter(batches.take, None) if batches is not None else iter(range(rank, n, task.workers))
    )
    scorer = NativeEval.for_model(setup.model, task.plan.negs)
    out = []
    for u in units:
        if u >= n:
            break
        result = eval_unit(
            setup.model, lambda key: task.tables[key].emb, task.sides, task.plan, u, scorer
        )
        out.append((u, result))
    return out


@dataclass
class WorkerSetup:
    model: ScoringModel
    model_states: list[Tensor]
    negs: NegativeSettings
    lr: float
    relation_lr: float
    batch_size: int
    dynamic: bool
    gate: BatchGate | None = None  # passed before every batch (synchronous strategies)
    group_queries: bool = False  # train_type: KvsAll (see bigembed.buckets.batching)


class BatchQueue:
    """The shared queue of a bucket's planned batches: a counter in shared memory.

    ``take`` hands out 0, 1, 2, ... exactly once each across all processes (the counter's lock
    makes read-and-increment atomic); ``reset`` starts a new bucket (only while no worker is
    taking). Passed to the workers as a process argument (a lock cannot travel in a queue).
    """

    def __init__(self, ctx: Any) -> None:
        self._next = ctx.Value("q", 0, lock=True)

    def take(self) -> int:
        with self._next.get_lock():
            k = int(self._next.value)
            self._next.value = k + 1
        return k

    def reset(self) -> None:
        with self._next.get_lock():
            self._next.value = 0


def _even_share(setup: WorkerSetup, task: BucketTask, rng: np.random.Generator) -> Iterator[Batch]:
    sel = slice(task.start, task.end)
    weight = None if task.weight is None else task.weight[sel]
    return make_batches(
        task.lhs[sel],
        task.rhs[sel],
        task.rel[sel],
        weight,
        setup.batch_size,
        setup.dynamic,
        rng,
        setup.group_queries,
    )


def _stolen(task: BucketTask, batches: BatchQueue) -> Iterator[Batch]:
    assert task.plan is not None
    n = int(task.plan.shape[0])
    while (k := batches.take()) < n:
        yield planned_batch(task.lhs, task.rhs, task.rel, task.weight, None, task.plan[k])


def run_task(
    setup: WorkerSetup,
    task: BucketTask,
    trainer: BatchTrainer,
    progress: Callable[[int, float], None],
    slot: int = 0,
    batches: BatchQueue | None = None,
) -> StepStats:
    """Train ``task``: its edge range, or with a plan, batches taken from ``batches`` until the
    queue is empty; ``progress(edges, loss)`` is called after every batch.

    ``slot``: this worker's index (its counter in the setup's gate)."""
    if task.delay > 0:
        time.sleep(task.delay)
    trainer.gen.manual_seed(task.seed)
    total = StepStats()
    gate = setup.gate
    if task.plan is not None:
        assert batches is not None, "a planned task needs the batch queue"
        source = _stolen(task, batches)
    else:
        source = _even_share(setup, task, np.random.default_rng(task.seed))
    for batch in source:
        if gate is not None:
            gate.wait_turn()
        lhs_key, rhs_key = task.sides[batch.relation_idx]
        stats = trainer.step(batch, task.tables[lhs_key], task.tables[rhs_key])
        total.add(stats)
        if gate is not None:
            gate.passed(slot)
        progress(stats.count, stats.loss)
    return total


def _make_trainer(setup: WorkerSetup) -> BatchTrainer:
    return BatchTrainer(
        setup.model, setup.model_states, setup.negs, setup.lr, setup.relation_lr, torch.Generator()
    )


def worker_main(
    rank: int, tasks: mp.Queue, results: mp.Queue, batches: BatchQueue | None = None
) -> None:
    """The worker loop; its first message is ``(setup, board, environment)``, then tasks until
    ``None``.

    Tasks come as :class:`BucketMessage` / :class:`EvalMessage` whose tables and edges are
    kept in a :class:`WorkerCache` until a :class:`Drop` names them (acknowledged in the
    board's ``ACK`` column when it has a sequence number).

    Runs after :func:`bigembed.train.hogwild.guard.worker_entry` has tied the process's life to
    the trainer's.
    """
    setup, board, environ = tasks.get()
    adopt_environment(environ)
    torch.set_num_threads(1)
    keep_freed_memory()
    trainer = _make_trainer(setup)
    cache = WorkerCache()

    def progress(edges: int, loss: float) -> None:
        board[rank, 0] += edges
        board[rank, 1] += loss

    while True:
        message = tasks.get()
        if message is None:
            return
        if isinstance(message, Drop):
            cache.drop(message.tokens)
            if message.seq > 0:
                board[rank, ACK] = float(message.seq)
            continue
        # (rank, "ok", stats or eval results) or (rank, "error", text)
        reply: tuple[int, str, StepStats | list[tuple[int, UnitResult]] | str]
        started = time.perf_counter()
        delay = 0.0
        task: BucketTask | EvalTask | None = None
        try:
            task = message.resolve(cache)
            if isinstance(task, EvalTask):
                reply = (rank, "ok", run_eval_task(setup, task, rank, batches))
            else:
                delay = task.delay
                reply = (rank, "ok", run_task(setup, task, trainer, progress, rank, batches))
        except Exception:
            reply = (rank, "error", traceback.format_exc())
        if isinstance(message, BucketMessage):  # the board's busy time is training time
            board[rank, BUSY] += time.perf_counter() - started - delay
        # Only the cache holds the tables now: the trainer's Drop (acknowledged) releases them
        # before an evicted partition's memory counts as free.
        task = None
        del message
        results.put(reply)


#: Column of the progress board holding each worker's seconds spent training tasks.
BUSY = 2
#: Column of the progress board holding the last acknowledged :class:`Drop` sequence number.
ACK = 3


class HogwildPool:
    """``steal``: split buckets by work stealing (``load_balancing: cost``), else even slices."""

    def __init__(self, setup: WorkerSetup, workers: int, steal: bool = True) -> None:
        self.setup = setup
        self.workers = workers
        self.steal = steal
        self.board = torch.zeros((workers, 4), dtype=torch.float64)
        self.last_busy: list[float] = []  # per worker: seconds busy in the last run()
        self._procs: list[BaseProcess] = []
        self._batches: BatchQueue | None = None
        self.sent = SentObjects()  # what every worker holds (see bigembed.train.hogwild.cache)
        self.buffers = EdgeBuffers()
        self._drop_lock = threading.Lock()
        self._drop_seq = 0
        if workers > 1:
            ctx = worker_context()
            self.board.share_memory_()
            self._batches = BatchQueue(ctx) if steal else None
            self._tasks = [ctx.Queue() for _ in range(workers)]
            self._results = ctx.Queue()
            for rank in range(workers):
                # Only small arguments: the setup follows as the first task message, so that a
                # worker guards itself against its parent's death before unpickling anything.
                p = ctx.Process(
                    target=worker_entry,
                    args=(os.getpid(), rank, self._tasks[rank], self._results, self._batches),
                    name=f"bigembed-hogwild-{rank}",
                    daemon=True,
                )
                p.start()
                self._procs.append(p)
                self._tasks[rank].put((setup, self.board, dict(os.environ)))
        else:
            keep_freed_memory()
            self._trainer = _make_trainer(setup)

    def progress(self) -> tuple[int, float]:
        edges, loss = self.board[:, :2].sum(dim=0).tolist()
        return int(edges), float(loss)

    def prepare(
        self, lhs: Tensor, rhs: Tensor, rel: Tensor, weight: Tensor | None, seed: int
    ) -> PreparedEdges:
        """The given (already shuffled) edges made ready for :meth:`train`: with work stealing
        the batch plan, and with several workers the edges in plan order in a shared
        :class:`~bigembed.train.memory.edge_buffers.EdgeBuffer`. Safe to call from another thread
        while a bucket trains (the loop's edge read-ahead)."""
        if self.workers == 1:
            return PreparedEdges(lhs, rhs, rel, weight, seed)
        plan: np.ndarray | None = None
        order: Tensor | None = None
        if self._batches is not None:
            order, plan = batch_plan(
                rel,
                self.setup.batch_size,
                self.setup.dynamic,
                np.random.default_rng(seed),
                (lhs, rhs) if self.setup.group_queries else None,
            )
        # in plan order: batch k is rows plan[k, 0]:plan[k, 1] of the buffer
        return self.buffers.fill((lhs, rhs, rel, weight), order, seed, plan)

    def run(
        self,
        tables: dict[PartitionKey, Table],
        sides: list[tuple[PartitionKey, PartitionKey]],
        lhs: Tensor,
        rhs: Tensor,
        rel: Tensor,
        weight: Tensor | None,
        seed: int,
        on_wait: Callable[[], None] = lambda: None,
        stagger: float = 0.0,
    ) -> StepStats:
        """:meth:`prepare` the given (already shuffled) edges, then :meth:`train` them."""
        edges = self.prepare(lhs, rhs, rel, weight, seed)
        return self.train(tables, sides, edges, on_wait, stagger)

    def train(
        self,
        tables: dict[PartitionKey, Table],
        sides: list[tuple[PartitionKey, PartitionKey]],
        edges: PreparedEdges,
        on_wait: Callable[[], None] = lambda: None,
        stagger: float = 0.0,
    ) -> StepStats:
        """Train prepared edges; returns the summed stats of all workers.

        ``stagger`` delays every worker but the first (PBG's ``hogwild_delay``, which lets the
        first worker move the fresh embeddings away from their initial values alone).
        """
        n, seed = edges.count, edges.seed
        bounds = np.linspace(0, n, self.workers + 1).astype(np.int64)
        busy_before = self.board[:, BUSY].tolist()
        if self.workers == 1:

            def progress(count: int, loss: float) -> None:
                self.board[0, 0] += count
                self.board[0, 1] += loss
                on_wait()

            task = BucketTask(
                tables, sides, edges.lhs, edges.rhs, edges.rel, edges.weight, 0, n, seed
            )
            started = time.perf_counter()
            stats = run_task(self.setup, task, self._trainer, progress)
            self.board[0, BUSY] += time.perf_counter() - started
            self.last_busy = [float(self.board[0, BUSY]) - busy_before[0]]
            return stats
        assert edges.buffer is not None, "prepare() the edges of a pool with several workers"
        try:
            if self._batches is not None:
                self._batches.reset()
            self._send_lazy_drops()
            handles = {k: self.sent.handle(t) for k, t in tables.items()}
            buffer = self.sent.handle(edges.buffer)
            for rank in range(self.workers):
                self._tasks[rank].put(
                    BucketMessage(
                        handles,
                        sides,
                        buffer,
                        n,
                        int(bounds[rank]),
                        int(bounds[rank + 1]),
                        seed * 1000 + rank,
                        stagger if rank > 0 else 0.0,
                        edges.plan,
                    )
                )
            total = StepStats()
            for payload in self._replies(on_wait):
                assert isinstance(payload, StepStats)
                total.add(payload)
        finally:
            self.buffers.release(edges)
        on_wait()
        busy_after = self.board[:, BUSY].tolist()
        self.last_busy = [a - b for a, b in zip(busy_after, busy_before, strict=True)]
        return total

    def forget(self, key: PartitionKey, table: Table) -> Callable[[], None]:
        """Partition ``key`` leaves the resident set (the partition store's ``on_release``): if
        the workers hold its ``table``, tell every worker to drop it now, ahead of any later
        task; returns the wait for their acknowledgement, which the write-back calls before the
        table counts as freed."""
        token = self.sent.forget(table) if self.workers > 1 else None
        if token is None:
            return _nothing
        with self._drop_lock:
            self._drop_seq += 1
            seq = self._drop_seq
            drop = Drop(seq, (token, *self.sent.lazy_drops()))
            for q in self._tasks:
                q.put(drop)
        return functools.partial(self._await_drop, seq)

    def _await_drop(self, seq: int) -> None:
        """Until every live worker has acknowledged drop ``seq`` (a dead one maps nothing)."""
        while True:
            procs = list(self._procs)  # empty once the pool is closed
            acked = self.board[:, ACK].tolist()
            if all(a >= seq or not p.is_alive() for a, p in zip(acked, procs, strict=False)):
                return
            time.sleep(0.0005)

    def _send_lazy_drops(self) -> None:
        tokens = self.sent.lazy_drops()
        if tokens:
            with self._drop_lock:
                for q in self._tasks:
                    q.put(Drop(0, tokens))

    def run_eval(
        self,
        tables: dict[PartitionKey, Table],
        sides: list[tuple[PartitionKey, PartitionKey]],
        plan: EvalPlan,
        on_wait: Callable[[], None] = lambda: None,
    ) -> list[UnitResult]:
        """Rank the units of a withheld-edge eval in the workers (each on its one thread, as
        they train); returns the results in unit order. With one worker: here."""
        if self.workers == 1:
            scorer = NativeEval.for_model(self.setup.model, plan.negs)
            return [
                eval_unit(self.setup.model, lambda key: tables[key].emb, sides, plan, u, scorer)
                for u in range(plan.num_units)
            ]
        if self._batches is not None:
            self._batches.reset()
        self._send_lazy_drops()
        handles = {k: self.sent.handle(t) for k, t in tables.items()}
        for rank in range(self.workers):
            self._tasks[rank].put(EvalMessage(handles, sides, plan, self.workers))
        results: dict[int, UnitResult] = {}
        for payload in self._replies(on_wait):
            assert isinstance(payload, list)
            results.update(payload)
        if len(results) != plan.num_units:
            raise RuntimeError(f"eval: {len(results)} of {plan.num_units} units ranked")
        return [results[u] for u in range(plan.num_units)]

    def _replies(self, on_wait: Callable[[], None]) -> Iterator[Any]:
        """Each worker's reply payload to the task just sent to all of them."""
        pending = set(range(self.workers))
        while pending:
            try:
                rank, status, payload = self._results.get(timeout=0.5)
            except queue.Empty:
                on_wait()
                self._check_alive()
                continue
            if status == "error":
                self.close(abandon=True)
                raise RuntimeError(f"Hogwild worker {rank} failed:\n{payload}")
            pending.discard(rank)
            yield payload

    def _check_alive(self) -> None:
        if not self._procs:  # closed (by another thread) while a step waited for replies
            raise BigembedError("the Hogwild workers were stopped")
        for rank, p in enumerate(self._procs):
            if not p.is_alive():
                code = p.exitcode
                self.close(abandon=True)
                hint = ""
                if code == -signal.SIGBUS:
                    hint = " (SIGBUS: /dev/shm is full; enlarge it or use more partitions)"
                elif code == -signal.SIGKILL:
                    hint = " (SIGKILL: probably out of memory)"
                raise BigembedError(f"Hogwild worker {rank} died with exit code {code}{hint}")

    def close(self, abandon: bool = False) -> None:
        """Stop the workers: each is told to exit after its task (they are idle between
        steps). ``abandon`` (an error, Ctrl-C or SIGTERM in the middle of a step, whose work
        is thrown away): kill them at once rather than wait for them to finish a task that
        may last a whole bucket. Either way no worker outlives this call by more than ~5 s."""
        for rank, p in enumerate(self._procs):
            if not p.is_alive():
                continue
            if abandon:
                _expect_broken_handshakes()
                p.kill()
            else:
                with contextlib.suppress(OSError, ValueError):
                    self._tasks[rank].put(None)
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []


#: When a pool last killed its workers (monotonic seconds; see _expect_broken_handshakes).
_last_abandon = -float("inf")
_previous_excepthook: Callable[..., Any] | None = None


def _expect_broken_handshakes() -> None:
    """Silence the tracebacks of killing workers mid-handshake, for a few seconds.

    A worker receives each shared tensor through a handshake with multiprocessing's resource
    sharer, a thread of this process that reports a connection broken by the peer with a full
    traceback (``sys.excepthook``). Workers killed while receiving (an abandoned pool: an
    error or an interruption right after they started) would print one such traceback after
    the run's one-line error; this hook drops those, and only those, for the next 10 s."""
    global _last_abandon, _previous_excepthook
    _last_abandon = time.monotonic()
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    from_sharer = any(
        frame.f_code.co_filename.endswith("resource_sharer.py")
        for frame, _ in traceback.walk_tb(tb)
    )
    if (
        from_sharer
        and issubclass(exc_type, (ConnectionError, EOFError))
        and time.monotonic() - _last_abandon < 10
    ):
        logger.debug("a killed worker broke its resource handshake: %s", exc)
        return
    assert _previous_excepthook is not None
    _previous_excepthook(exc_type, exc, tb)


def _nothing() -> None:
    """A drop nobody has to wait for (the workers never held the table)."""
