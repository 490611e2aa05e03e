"""The trainer's side of Hogwild training: a pool of worker processes for one run.

A pool of ``workers`` processes (forked from a preloaded forkserver, one torch thread each:
:func:`worker_context`) receives, per bucket, the shared-memory tables and the shuffled edges
(each object sent once and then named by a token, see :mod:`bigembed.train.hogwild.cache`; the
edges in reused buffers, :mod:`bigembed.train.memory.edge_buffers`), trains its parts of them
(:mod:`bigembed.train.hogwild.worker`) and reports stats; the messages are those of
:mod:`bigembed.train.hogwild.messages`. The workers also rank the withheld-edge eval before and
after each bucket (:meth:`HogwildPool.run_eval`, as PBG evaluates in its pool).

Progress is published through a small shared tensor so the trainer can draw a live progress bar.
With one worker everything runs in the calling process. Workers die with the trainer, even one
killed while it starts up (see :mod:`bigembed.train.hogwild.guard`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

from bigembed.buckets import batch_plan
from bigembed.errors import BigembedError
from bigembed.kernels import StepStats, Table
from bigembed.partition_keys import PartitionKey
from bigembed.ranking import EvalPlan, UnitResult, eval_unit
from bigembed.train.hogwild.cache import Drop, SentObjects
from bigembed.train.hogwild.guard import PRELOAD, worker_entry
from bigembed.train.hogwild.malloc import keep_freed_memory
from bigembed.train.hogwild.messages import (
    ACK,
    BOARD_COLUMNS,
    BUSY,
    EDGES,
    LOSS,
    BatchQueue,
    BucketMessage,
    BucketTask,
    EvalMessage,
    WorkerSetup,
)
from bigembed.train.hogwild.worker import MAIN, make_trainer, run_task
from bigembed.train.memory.edge_buffers import EdgeBuffers, PreparedEdges

__all__ = ["ACK", "BUSY", "BatchQueue", "HogwildPool", "WorkerSetup", "worker_context"]

logger = logging.getLogger(__name__)


def worker_context() -> Any:
    """The multiprocessing context workers start from: a forkserver preloaded with the worker
    code where the platform has one (a worker then starts without importing torch again), else
    spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])  # read when the forkserver starts (once)
    return ctx


class HogwildPool:
    """``steal``: split buckets by work stealing (``load_balancing: cost``), else even slices."""

    def __init__(self, setup: WorkerSetup, workers: int, steal: bool = True) -> None:
        self.setup = setup
        self.workers = workers
        self.steal = steal
        self.board = torch.zeros((workers, BOARD_COLUMNS), dtype=torch.float64)
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
                    args=(
                        os.getpid(),
                        rank,
                        MAIN,
                        self._tasks[rank],
                        self._results,
                        self._batches,
                    ),
                    name=f"bigembed-hogwild-{rank}",
                    daemon=True,
                )
                p.start()
                self._procs.append(p)
                self._tasks[rank].put((setup, self.board, dict(os.environ)))
        else:
            keep_freed_memory()
            self._trainer = make_trainer(setup)

    def progress(self) -> tuple[int, float]:
        edges, loss = self.board[:, [EDGES, LOSS]].sum(dim=0).tolist()
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

    def prepare_planned(
        self,
        edges: tuple[Tensor, Tensor, Tensor, Tensor | None],
        order: Tensor,
        plan: np.ndarray,
        seed: int,
        claims: Iterable[int] | None = None,
    ) -> PreparedEdges:
        """Edges whose batches were planned by the caller (data-parallel training: a replica's
        share of a bucket's batches, in the sampler's order): batch ``k`` is the edges
        ``order[plan[k, 0]:plan[k, 1]]``. The batches are trained in plan order, taken from the
        shared queue with several workers (the pool must steal: ``steal=True``); with one
        worker, ``claims`` may give the rows to train instead, as they come."""
        if self.workers > 1 and self._batches is None:
            raise ValueError("a planned bucket needs a work-stealing pool (steal=True)")
        if claims is not None and self.workers > 1:
            raise ValueError("claimed batches need a single worker")
        if self.workers == 1:
            lhs, rhs, rel, weight = (None if t is None else t[order] for t in edges)
            assert lhs is not None and rhs is not None and rel is not None
            return PreparedEdges(lhs, rhs, rel, weight, seed, plan, claims=claims)
        return self.buffers.fill(edges, order, seed, plan)

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
                self.board[0, EDGES] += count
                self.board[0, LOSS] += loss
                on_wait()

            task = BucketTask(
                tables,
                sides,
                edges.lhs,
                edges.rhs,
                edges.rel,
                edges.weight,
                0,
                n,
                seed,
                plan=edges.plan,
                claims=edges.claims,
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
            scorer = self.setup.kernel.eval_kernel(self.setup.model, plan.negs)
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
