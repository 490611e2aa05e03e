"""The Hogwild worker: the loop a worker process runs, and the training of one task.

A worker receives its :class:`~bigembed.train.hogwild.messages.WorkerSetup` once, then tasks
(:mod:`bigembed.train.hogwild.messages`) until ``None``: it trains its part of a bucket, or ranks
its units of a withheld-edge eval, on one torch thread, updating the shared tables in place
without locks, and replies with its stats. How a bucket's edges are split (config
``load_balancing``):

* ``cost`` (work stealing): the trainer plans the bucket's batches once
  (:func:`~bigembed.buckets.batching.batch_plan`) and the workers take them one at a time from the
  shared :class:`~bigembed.train.hogwild.messages.BatchQueue` until none is left, so a worker
  slowed down (a costlier relation, a busy core, ``hogwild_delay``) simply takes fewer and
  nobody idles at the end of a bucket. Every batch is trained exactly once;
* ``pbg``: each worker gets an even slice of the shuffled edges and batches it itself.

The kernel (native or eager) is the trainer's choice, carried by the setup; the worker only
loads it. With one worker the trainer runs :func:`run_task` itself.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.multiprocessing as mp

from bigembed.buckets import Batch, make_batches, planned_batch
from bigembed.kernels import BatchTrainer, StepStats
from bigembed.ranking import UnitResult, eval_unit
from bigembed.train.hogwild.cache import Drop, WorkerCache
from bigembed.train.hogwild.guard import adopt_environment
from bigembed.train.hogwild.malloc import keep_freed_memory
from bigembed.train.hogwild.messages import (
    ACK,
    BUSY,
    EDGES,
    LOSS,
    BatchQueue,
    BucketMessage,
    BucketTask,
    EvalTask,
    WorkerSetup,
)

#: The worker loop, as the guard resolves it once the worker's life is tied to the trainer's.
MAIN = "bigembed.train.hogwild.worker:worker_main"


def run_eval_task(
    setup: WorkerSetup, task: EvalTask, rank: int, batches: BatchQueue | None
) -> list[tuple[int, UnitResult]]:
    """The units this worker ranks, with their results."""
    n = task.plan.num_units
    units: Iterator[int] = (
        iter(batches.take, None) if batches is not None else iter(range(rank, n, task.workers))
    )
    scorer = setup.kernel.eval_kernel(setup.model, task.plan.negs)
    out = []
    for u in units:
        if u >= n:
            break
        result = eval_unit(
            setup.model, lambda key: task.tables[key].emb, task.sides, task.plan, u, scorer
        )
        out.append((u, result))
    return out


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


def _in_order(task: BucketTask) -> Iterator[Batch]:
    """A planned task trained by one worker: the plan's batches in order (data-parallel
    training gives each replica its batches in the sampler's order)."""
    assert task.plan is not None
    rows = task.plan if task.claims is None else (task.plan[k] for k in task.claims)
    for row in rows:
        yield planned_batch(task.lhs, task.rhs, task.rel, task.weight, None, row)


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
        source = _in_order(task) if batches is None else _stolen(task, batches)
    else:
        source = _even_share(setup, task, np.random.default_rng(task.seed))
    for batch in source:
        if gate is not None:
            gate.wait_turn(slot)
        lhs_key, rhs_key = task.sides[batch.relation_idx]
        frozen = (setup.frozen_rows.get(lhs_key, 0), setup.frozen_rows.get(rhs_key, 0))
        stats = trainer.step(batch, task.tables[lhs_key], task.tables[rhs_key], frozen)
        total.add(stats)
        if gate is not None:
            gate.passed(slot)
        progress(stats.count, stats.loss)
    return total


def make_trainer(setup: WorkerSetup) -> BatchTrainer:
    """The batch trainer of one worker, with the kernel the trainer chose."""
    return BatchTrainer(
        setup.model,
        setup.model_states,
        setup.negs,
        setup.lr,
        setup.relation_lr,
        torch.Generator(),
        native=setup.kernel.step_kernel(setup.model, setup.negs),
        freeze_params=setup.freeze_relations,
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
    trainer = make_trainer(setup)
    cache = WorkerCache()

    def progress(edges: int, loss: float) -> None:
        board[rank, EDGES] += edges
        board[rank, LOSS] += loss

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
