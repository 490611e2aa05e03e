"""Hogwild training of one bucket: worker processes update shared embeddings without locks.

A pool of ``workers`` processes (spawned once, one torch thread each) receives, per bucket, the
shared-memory tables and the shuffled edges, trains its even share of them, and reports stats.
Progress is published through a small shared tensor so the parent can draw a live progress bar.
With one worker everything runs in the calling process. Workers die with the trainer, even one
killed while they start up (see :mod:`bigembed.train.worker_guard`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

from bigembed.buckets.batching import make_batches
from bigembed.errors import BigembedError
from bigembed.model.scoring import NegativeSettings, ScoringModel
from bigembed.partition_keys import PartitionKey
from bigembed.train.batch_gate import BatchGate
from bigembed.train.malloc_tuning import keep_freed_memory
from bigembed.train.step import BatchTrainer, StepStats, Table
from bigembed.train.worker_guard import worker_entry

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


def run_task(
    setup: WorkerSetup,
    task: BucketTask,
    trainer: BatchTrainer,
    progress: Callable[[int, float], None],
    slot: int = 0,
) -> StepStats:
    """Train ``task``'s edge range; ``progress(edges, loss)`` is called after every batch.

    ``slot``: this worker's index (its counter in the setup's gate)."""
    if task.delay > 0:
        time.sleep(task.delay)
    sel = slice(task.start, task.end)
    weight = None if task.weight is None else task.weight[sel]
    trainer.gen.manual_seed(task.seed)
    rng = np.random.default_rng(task.seed)
    total = StepStats()
    gate = setup.gate
    for batch in make_batches(
        task.lhs[sel], task.rhs[sel], task.rel[sel], weight, setup.batch_size, setup.dynamic, rng
    ):
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


def worker_main(rank: int, tasks: mp.Queue, results: mp.Queue) -> None:
    """The worker loop; its first message is ``(setup, board)``, then tasks until ``None``.

    Runs after :func:`bigembed.train.worker_guard.worker_entry` has tied the process's life to
    the trainer's.
    """
    setup, board = tasks.get()
    torch.set_num_threads(1)
    keep_freed_memory()
    trainer = _make_trainer(setup)

    def progress(edges: int, loss: float) -> None:
        board[rank, 0] += edges
        board[rank, 1] += loss

    while True:
        task = tasks.get()
        if task is None:
            return
        reply: tuple[int, str, StepStats | str]  # (rank, "ok", stats) or (rank, "error", text)
        try:
            reply = (rank, "ok", run_task(setup, task, trainer, progress, rank))
        except Exception:
            reply = (rank, "error", traceback.format_exc())
        # Drop the task's tables before replying: once the trainer has every reply it may evict
        # a partition, and a mapping still held here would keep its shared memory alive.
        del task
        results.put(reply)


class HogwildPool:
    def __init__(self, setup: WorkerSetup, workers: int) -> None:
        self.setup = setup
        self.workers = workers
        self.board = torch.zeros((workers, 2), dtype=torch.float64)
        self._procs: list[BaseProcess] = []
        if workers > 1:
            ctx = mp.get_context("spawn")
            self.board.share_memory_()
            self._tasks = [ctx.Queue() for _ in range(workers)]
            self._results = ctx.Queue()
            for rank in range(workers):
                # Only small arguments: the setup follows as the first task message, so that a
                # worker guards itself against its parent's death before unpickling anything.
                p = ctx.Process(
                    target=worker_entry,
                    args=(os.getpid(), rank, self._tasks[rank], self._results),
                    name=f"bigembed-hogwild-{rank}",
                    daemon=True,
                )
                p.start()
                self._procs.append(p)
                self._tasks[rank].put((setup, self.board))
        else:
            keep_freed_memory()
            self._trainer = _make_trainer(setup)

    def progress(self) -> tuple[int, float]:
        edges, loss = self.board.sum(dim=0).tolist()
        return int(edges), float(loss)

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
        """Train the given (already shuffled) edges; returns the summed stats of all workers.

        ``stagger`` delays every worker but the first (PBG's ``hogwild_delay``, which lets the
        first worker move the fresh embeddings away from their initial values alone).
        """
        n = int(lhs.shape[0])
        bounds = np.linspace(0, n, self.workers + 1).astype(np.int64)
        if self.workers == 1:

            def progress(edges: int, loss: float) -> None:
                self.board[0, 0] += edges
                self.board[0, 1] += loss
                on_wait()

            task = BucketTask(tables, sides, lhs, rhs, rel, weight, 0, n, seed)
            return run_task(self.setup, task, self._trainer, progress)
        for t in (lhs, rhs, rel, weight):
            if t is not None:
                t.share_memory_()  # in place: the tasks pickle handles to shared memory
        for rank in range(self.workers):
            self._tasks[rank].put(
                BucketTask(
                    tables,
                    sides,
                    lhs,
                    rhs,
                    rel,
                    weight,
                    int(bounds[rank]),
                    int(bounds[rank + 1]),
                    seed * 1000 + rank,
                    stagger if rank > 0 else 0.0,
                )
            )
        total = StepStats()
        pending = set(range(self.workers))
        while pending:
            try:
                rank, status, payload = self._results.get(timeout=0.5)
            except queue.Empty:
                on_wait()
                self._check_alive()
                continue
            if status == "error":
                self.close()
                raise RuntimeError(f"Hogwild worker {rank} failed:\n{payload}")
            total.add(payload)
            pending.discard(rank)
        on_wait()
        return total

    def _check_alive(self) -> None:
        for rank, p in enumerate(self._procs):
            if not p.is_alive():
                code = p.exitcode
                self.close()
                hint = ""
                if code == -signal.SIGBUS:
                    hint = " (SIGBUS: /dev/shm is full; enlarge it or use more partitions)"
                elif code == -signal.SIGKILL:
                    hint = " (SIGKILL: probably out of memory)"
                raise BigembedError(f"Hogwild worker {rank} died with exit code {code}{hint}")

    def close(self) -> None:
        for rank, p in enumerate(self._procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    self._tasks[rank].put(None)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
