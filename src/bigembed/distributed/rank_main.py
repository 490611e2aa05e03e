"""Entry points of one distributed rank: ``bigembed train --rank R`` and ``partition-server``.

Any error ends the whole run, not just this rank: a user error of this rank (bad checkpoint,
unshared disk...) is published to the others at once; a communication error first gives the
heartbeats a moment to name the peer that died. The process then leaves with ``os._exit``
and a one-line message, because threads blocked in gloo would otherwise delay the exit.
SIGTERM and SIGINT take the same path (:mod:`bigembed.distributed.signals`).

Thread counts: ranks started by hand do not get the ``OMP_NUM_THREADS`` that ``bigembed launch``
sets, and several trainers on one machine, each with as many torch threads as there are cores,
run many times slower than with their share. So, unless ``OMP_NUM_THREADS`` is set, a trainer
takes ``cpu_count // (trainers on this machine)`` threads once it knows who joined.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from typing import TypeVar

from bigembed.config import ConfigSchema
from bigembed.distributed.context import DistContext
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.shared_stop import RankZeroStop
from bigembed.distributed.signals import install_stop_signals
from bigembed.errors import BigembedError, PeerError
from bigembed.train import TrainResult, training_locks

T = TypeVar("T")

logger = logging.getLogger(__name__)


def open_context(
    cfg: ConfigSchema, rank: int, command: str
) -> tuple[DistContext, Callable[[], None]]:
    """Join the run as ``rank`` with SIGTERM/SIGINT ending it for everybody; returns the open
    context and the function that restores the signal handlers. A failed join leaves nothing
    installed."""
    ctx = DistContext(cfg, rank, command=command)
    uninstall = install_stop_signals(ctx.abort)
    try:
        ctx.open()
    except BaseException:
        ctx.close(clean=False)
        uninstall()
        raise
    return ctx, uninstall


def run_guarded(ctx: DistContext, body: Callable[[], T]) -> T:
    """``body()``, or the end of the whole run if it raises (this never returns then)."""
    try:
        return body()
    except PeerError as exc:
        ctx.fail(str(exc))
    except BigembedError as exc:
        ctx.abort(str(exc))
    except RuntimeError as exc:  # gloo and c10d raise RuntimeError subclasses
        logger.debug("communication error:\n%s", traceback.format_exc())
        ctx.fail(f"communication error: {str(exc).strip().splitlines()[0]}")
    except KeyboardInterrupt:
        ctx.abort("interrupted")
    except BaseException:
        logger.error("unexpected error:\n%s", traceback.format_exc())
        ctx.abort("unexpected error (traceback above)")
    raise AssertionError("unreachable: the context ends the process")


def train_distributed(
    cfg: ConfigSchema,
    *,
    rank: int,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
    stop_rule: Callable[[int], RankZeroStop] | None = None,
) -> TrainResult:
    """Run trainer ``rank`` of a ``num_machines``-trainer run until the last step is committed
    (or a stop rule ends it).

    ``report`` receives rank 0's per-step summary lines (the command prints them), with every
    trainer's figures merged. ``stop_rule``: builds rank 0's rule that may end the run after a
    step, from the run's steps per epoch (early stopping: required on rank 0 when the config
    has ``early_stopping``, ignored on the others); every trainer follows its verdicts
    (:mod:`bigembed.distributed.shared_stop`).
    """
    RankLayout.of(cfg).check_trainer_rank(rank)
    parts = max((e.num_partitions for e in cfg.entities.values()), default=1)
    busy = max(1, parts // 2)
    data_parallel = cfg.distributed_mode == "data_parallel"
    if rank == 0 and cfg.num_machines > busy and not data_parallel:
        logger.warning(
            "num_machines is %d but with %d partitions at most %d trainers can work at once "
            "(a bucket holds 2 partitions, none may be held twice); the others will wait. "
            "Advice: num_machines = num_partitions / 2, or distributed_mode: data_parallel",
            cfg.num_machines,
            parts,
            busy,
        )
    # rank 0 writes the checkpoint for the whole launch: it alone holds it (the other ranks
    # of the launch write their shares under its hold); every rank reads the stores
    with training_locks(cfg, writes=rank == 0):
        return _train_ranks(cfg, rank, progress, report, data_parallel, stop_rule)


def _train_ranks(
    cfg: ConfigSchema,
    rank: int,
    progress: bool,
    report: Callable[[str], None] | None,
    data_parallel: bool,
    stop_rule: Callable[[int], RankZeroStop] | None,
) -> TrainResult:
    from bigembed.distributed.data_parallel import DataParallelTrainer
    from bigembed.distributed.shared_stop import SharedStop
    from bigembed.distributed.trainer import DistributedTrainer

    ctx, uninstall = open_context(cfg, rank, "train")
    share_cores(ctx)

    def body() -> TrainResult:
        mode = DataParallelTrainer if data_parallel else DistributedTrainer
        trainer = mode(
            cfg, ctx, progress=progress and rank == 0, report=report if rank == 0 else None
        )
        if cfg.early_stopping is not None:
            assert rank != 0 or stop_rule is not None, "early_stopping needs rank 0's rule"
            steps_per_epoch = len(cfg.edge_paths) * trainer.job.num_chunks
            rule = stop_rule(steps_per_epoch) if stop_rule is not None and rank == 0 else None
            trainer.stop = SharedStop(ctx, rule)
        result = trainer.train()
        trainer.shutdown()
        return result

    result = run_guarded(ctx, body)
    ctx.close()
    uninstall()
    return result


def serve_partitions(cfg: ConfigSchema, *, index: int) -> int:
    """Run partition server ``index`` (world rank ``num_machines + index``) until told to stop."""
    from bigembed.distributed.partition_server import PartitionServer

    layout = RankLayout.of(cfg)
    rank = layout.partition_server_rank(index)
    ctx, uninstall = open_context(cfg, rank, "partition-server")

    def body() -> None:
        server = PartitionServer(
            rank,
            ctx.address,
            ctx.timeout,
            on_error=ctx.fail,
            session=ctx.session,
            trainers=ctx.layout.num_trainers,
        )
        server.start()
        while not server.stopped.wait(1.0):
            pass
        logger.info(
            "partition server %d: stopped (%d partitions held, %.1f MB sent, %.1f MB received)",
            index,
            len(server.tables),
            server.bytes_sent / 1e6,
            server.bytes_received / 1e6,
        )

    run_guarded(ctx, body)
    ctx.close()
    uninstall()
    return 0


def share_cores(ctx: DistContext) -> None:
    """Give this trainer its share of the machine's cores (unless OMP_NUM_THREADS is set)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return
    local = max(1, ctx.local_trainers())
    threads = max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for the Hogwild workers it starts
    logger.info(
        "%s: %d torch threads (%d trainers on this machine; set OMP_NUM_THREADS to override)",
        ctx.layout.role(ctx.rank),
        threads,
        local,
    )
