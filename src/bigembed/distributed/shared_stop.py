"""Rank 0 decides, every trainer follows: ending a distributed run early, all ranks together.

Early stopping evaluates the checkpoint a step committed, and only rank 0 is sure to see it
(with or without a shared disk; :mod:`bigembed.distributed.shared_checkpoint`). So rank 0 runs
the rule (a :class:`RankZeroStop`: :class:`bigembed.selection.EarlyStopping`) and
:class:`SharedStop` hands its verdict to every trainer over the rendezvous store: after each
committed step rank 0 asks the rule, publishes the verdict (signed when the run has a secret)
and every trainer reads it after a barrier, so all stop after the same version, or none does.
The barrier waits as long as every peer is alive (an evaluation can take longer than
``distributed_timeout``); the watchdog ends the wait if rank 0 dies while it evaluates.

Before the first step the same happens once for the rule's start: a run that was stopped stays
stopped on every rank, and a version a killed run committed without its evaluation is
evaluated first.
"""

from __future__ import annotations

import json
from typing import Protocol

from bigembed.distributed.context import DistContext
from bigembed.distributed.shared_checkpoint import publish_signed, signed_value
from bigembed.train import Observer, StepRecord, StopTraining


class RankZeroStop(Protocol):
    """A rule that may end training, run on rank 0 only."""

    def start(self, committed: int) -> str | None:
        """Before training resumes after version ``committed``: why the run is over already,
        or None to train."""
        ...

    def step_committed(self, record: StepRecord) -> None:
        """After the commit of ``record``'s step; raises :class:`StopTraining` to end the run."""
        ...


class SharedStop(Observer):
    """The observer every trainer runs (see the module docstring); ``rule`` on rank 0 only."""

    def __init__(self, ctx: DistContext, rule: RankZeroStop | None) -> None:
        assert (rule is not None) == (ctx.rank == 0), "rank 0, and only rank 0, has the rule"
        self.ctx = ctx
        self.rule = rule

    def at_start(self, committed: int) -> str | None:
        """Every trainer, before its first step: why the run is over already (or None)."""
        reason = self.rule.start(committed) if self.rule is not None else None
        return self._share("start", reason)

    def step_committed(self, record: StepRecord) -> None:
        reason = None
        if self.rule is not None:
            try:
                self.rule.step_committed(record)
            except StopTraining as stop:
                reason = str(stop) or "stopped"
        reason = self._share(f"v{record.at.version}", reason)
        if reason is not None:
            raise StopTraining(reason)

    def _share(self, name: str, reason: str | None) -> str | None:
        """Rank 0's ``reason`` (None: go on), as every trainer reads it."""
        ctx = self.ctx
        assert ctx.store is not None
        key = f"stop/{name}"
        if ctx.rank == 0:
            publish_signed(ctx.store, ctx.session, key, json.dumps(reason))
        ctx.barrier(key)
        verdict = json.loads(signed_value(ctx, key))
        return None if verdict is None else str(verdict)
