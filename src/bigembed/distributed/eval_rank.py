"""``bigembed eval CONFIG --rank R``: one rank of a distributed evaluation.

The ``num_machines`` ranks (training's partition servers take no part) join as trainers do
(:class:`~bigembed.distributed.context.DistContext`: rendezvous, handshake, config check,
heartbeats, the shared secret). Then every rank:

1. reads the checkpoint, the edges to evaluate and the filter edges, from its own disk (the
   same files everywhere, or copies: nothing has to be shared), and checks with the others that
   they all hold the same checkpoint version, edges and filters;
2. ranks the share of the edges that Bagua's load-balancing sampler gives it, the cost of an
   edge being its candidates times the cost of a score (:func:`bigembed.eval.eval_shares`);
3. sends its per-edge ranks to rank 0, which puts them back in input order and builds the
   report with the code a single machine uses: the same report as ``bigembed eval`` on one
   machine.

Waiting for the slowest rank goes through store barriers that last as long as every rank is
alive (a gloo collective would time out after ``distributed_timeout``); a rank that dies or
fails ends every rank, as in training. Only full ranking runs on several ranks: the sampled
protocol's negatives depend on how the edges are batched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

from bigembed.config import ConfigSchema
from bigembed.distributed.layout import RankLayout
from bigembed.distributed.rank_main import open_context, run_guarded, share_cores
from bigembed.errors import ConfigError, InputError
from bigembed.eval import (
    EvalReport,
    Evaluation,
    edge_costs,
    eval_shares,
    merge_rankings,
    prepare_evaluation,
)


@dataclass(frozen=True)
class RankEval:
    """What one rank of a distributed evaluation did; rank 0 also has the merged report."""

    rank: int
    ranked: int  # edges this rank ranked (its share)
    total: int  # edges of the evaluation
    report: EvalReport | None


def eval_distributed(
    cfg: ConfigSchema,
    *,
    rank: int,
    edge_paths: Sequence[str] | None = None,
    filter_paths: Sequence[str] | None = None,
    progress: bool = False,
    before: Callable[[], None] | None = None,
    **options: Any,
) -> RankEval:
    """Run rank ``rank`` of a ``num_machines``-rank evaluation (rank 0's result holds the
    report). ``options``: :func:`bigembed.eval.prepare_evaluation`'s keywords; ``before``
    runs on rank 0 once every rank has joined (a check that fails stops every rank)."""
    if cfg.num_machines < 2 or not cfg.distributed_init_method:
        raise ConfigError(
            "--rank evaluates on several machines: set num_machines >= 2 and "
            "distributed_init_method in the config (or run `bigembed launch -n N CONFIG eval`)"
        )
    if options.get("protocol", "full") != "full":
        raise InputError(
            "--protocol sampled runs on one machine only (its negatives depend on how the "
            "edges are batched); drop --rank, or use the full protocol"
        )
    run_cfg = cfg.model_copy(update={"num_partition_servers": 0})
    RankLayout.of(run_cfg).check_trainer_rank(rank)
    ctx, uninstall = open_context(run_cfg, rank, "eval")
    share_cores(ctx)
    num_ranks = run_cfg.num_machines

    def body() -> RankEval:
        if rank == 0 and before is not None:
            before()
        evaluation = prepare_evaluation(cfg, edge_paths, filter_paths, **options)
        ctx.barrier("eval-prepared", num_ranks)
        _check_same_inputs(evaluation, num_ranks)
        rows = eval_shares(edge_costs(evaluation), num_ranks)[rank]
        ranking, _ = evaluation.rank(rows, progress=progress and rank == 0)
        ctx.barrier("eval-ranked", num_ranks)
        gathered: list[Any] | None = [None] * num_ranks if rank == 0 else None
        dist.gather_object((rows, ranking), gathered, dst=0)
        total = len(evaluation.edges)
        report = None
        if gathered is not None:
            report = evaluation.report(merge_rankings(total, gathered))
        return RankEval(rank, len(rows), total, report)

    result = run_guarded(ctx, body)
    ctx.close()
    uninstall()
    return result


def _fingerprint(evaluation: Evaluation) -> str:
    """What must be the same on every rank: checkpoint version, evaluated and filter edges."""
    digest = hashlib.sha256()
    edges = evaluation.edges
    for column in (edges.lhs, edges.rel, edges.rhs):
        digest.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    known = evaluation.known.num_edges if evaluation.known is not None else -1
    return (
        f"version {evaluation.trained.version}, {len(edges)} edges, {known} known, "
        + (digest.hexdigest()[:16])
    )


def _check_same_inputs(evaluation: Evaluation, num_ranks: int) -> None:
    mine = _fingerprint(evaluation)
    everyone: list[Any] = [None] * num_ranks
    dist.all_gather_object(everyone, mine)
    differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differ:
        raise InputError(
            "the ranks evaluate different inputs (rank 0: "
            f"{everyone[0]}; "
            + "; ".join(f"rank {r}: {everyone[r]}" for r in differ)
            + "): give every rank the same checkpoint and edge files"
        )
