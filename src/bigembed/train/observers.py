"""Observers of the training loop: progress display and the withheld-edge eval.

The loop calls every observer, in list order, at five points of a step (see
:class:`TrainingObserver`). An observer may annotate the records it is handed
(:class:`WithheldEdgeEval` adds the eval metrics), so observers that annotate come before
observers that show (:class:`ProgressDisplay`). Observers never change what is trained.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor
from tqdm import tqdm

from bigembed.buckets import negative_settings
from bigembed.config import ConfigSchema
from bigembed.kernels import Table, entity_table
from bigembed.model import ScoringModel
from bigembed.partition_keys import Bucket, BucketSides, PartitionKey
from bigembed.ranking import EvalPlan, RankingSums, UnitResult, evaluate_edges
from bigembed.train.iteration import Iteration, mix_seed
from bigembed.train.records import BucketRecord, StepRecord


@dataclass
class HeldOut:
    """The withheld edges of a bucket chunk: never trained, scored before and after."""

    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None


#: Ranks the units of a withheld-edge eval of the bucket, returning them in unit order.
RunEval = Callable[[EvalPlan], list[UnitResult]]


@dataclass
class BucketWork:
    """A bucket being trained: its resident tables and relation sides, and its withheld edges.

    ``run_eval``, when the loop sets it, ranks a withheld-edge eval where training runs (the
    Hogwild workers); without it the eval runs in the observer's process."""

    it: Iteration
    bucket: Bucket
    tables: dict[PartitionKey, Table]
    sides: BucketSides
    held_out: HeldOut | None
    run_eval: RunEval | None = None


class StopTraining(Exception):
    """Raised by an observer from ``step_committed`` to end training after that step (early
    stopping, a pruned trial); the message says why. The committed checkpoint stays as it is."""


class TrainingObserver(Protocol):
    """Watches a step; called by the loop in this order for every step it runs."""

    def step_started(self, it: Iteration, num_edges: int) -> None:
        """Before the step's first bucket; the step trains ``num_edges`` edges in all."""

    def bucket_started(self, work: BucketWork) -> None:
        """A bucket's tables are resident and its edges loaded; training follows."""

    def training(self, edges: int, loss: float) -> None:
        """Periodically while workers train: ``edges`` trained so far in the step, their
        summed ``loss``."""

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        """The bucket is trained; ``record`` is its stats record (timing not yet stamped)."""

    def step_finished(self, record: StepRecord) -> None:
        """The step's partitions are saved; ``record`` is about to be committed."""

    def step_committed(self, record: StepRecord) -> None:
        """The step is committed (its checkpoint version is on disk); may raise
        :class:`StopTraining` to end the run here."""


class Observer:
    """An observer that does nothing: subclass it and override the calls you need."""

    def step_started(self, it: Iteration, num_edges: int) -> None:
        pass

    def bucket_started(self, work: BucketWork) -> None:
        pass

    def training(self, edges: int, loss: float) -> None:
        pass

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        pass

    def step_finished(self, record: StepRecord) -> None:
        pass

    def step_committed(self, record: StepRecord) -> None:
        pass


class Observers(Observer):
    """Several observers called in order, as one."""

    def __init__(self, observers: Sequence[TrainingObserver]) -> None:
        self.observers = list(observers)

    def step_started(self, it: Iteration, num_edges: int) -> None:
        for o in self.observers:
            o.step_started(it, num_edges)

    def bucket_started(self, work: BucketWork) -> None:
        for o in self.observers:
            o.bucket_started(work)

    def training(self, edges: int, loss: float) -> None:
        for o in self.observers:
            o.training(edges, loss)

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        for o in self.observers:
            o.bucket_finished(work, record)

    def step_finished(self, record: StepRecord) -> None:
        for o in self.observers:
            o.step_finished(record)

    def step_committed(self, record: StepRecord) -> None:
        for o in self.observers:
            o.step_committed(record)


class WithheldEdgeEval(Observer):
    """PBG's ``eval_fraction``: ranks each bucket's withheld edges before and after training it,
    and adds the metrics to the bucket and step records (``eval_stats_before/after``). The
    ranking runs in the Hogwild workers when the loop offers them (``BucketWork.run_eval``),
    as PBG evaluates in its worker pool; the numbers do not depend on where it runs."""

    def __init__(self, cfg: ConfigSchema, model: ScoringModel) -> None:
        self.model = model
        self.seed = cfg.seed
        self.negs = negative_settings(cfg, for_eval=True)
        self.batch_size = cfg.batch_size  # evaluate_edges rounds it to the batch negatives
        self._before: RankingSums | None = None
        self.step_before, self.step_after = RankingSums(), RankingSums()

    def _evaluate(self, work: BucketWork) -> RankingSums:
        assert work.held_out is not None
        h = work.held_out
        i, j = work.bucket
        seed = mix_seed(self.seed, 4, work.it.index, i, j)
        tables, run_eval = work.tables, work.run_eval
        if any(t.bags is not None for t in tables.values()):
            # Featurized types are ranked by their entity rows (bag means), computed here.
            tables = {k: Table(entity_table(t), t.state) for k, t in tables.items()}
            run_eval = None
        return evaluate_edges(
            self.model,
            tables,
            work.sides,
            h.lhs,
            h.rhs,
            h.rel,
            h.weight,
            self.negs,
            self.batch_size,
            seed,
            run_eval,
        )

    def step_started(self, it: Iteration, num_edges: int) -> None:
        self.step_before, self.step_after = RankingSums(), RankingSums()

    def bucket_started(self, work: BucketWork) -> None:
        self._before = self._evaluate(work) if work.held_out is not None else None

    def bucket_finished(self, work: BucketWork, record: BucketRecord) -> None:
        before, self._before = self._before, None
        if before is None:
            return
        after = self._evaluate(work)
        self.step_before.merge(before)
        self.step_after.merge(after)
        record.eval_before, record.eval_after = before.summary(), after.summary()

    def step_finished(self, record: StepRecord) -> None:
        if self.step_before.count:
            record.eval_before = self.step_before.summary()
            record.eval_after = self.step_after.summary()


class ProgressDisplay(Observer):
    """A tqdm bar per step (edges, loss, edges/s) if ``bars``, and one summary line per
    committed step handed to ``report`` (if given: the command decides where it goes). The
    line shows the committed record: in a distributed run, every trainer's figures merged."""

    def __init__(
        self,
        num_epochs: int,
        num_edge_paths: int,
        num_chunks: int,
        *,
        bars: bool = True,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.bars = bars
        self.report = report
        self.num_epochs = num_epochs
        self.num_edge_paths = num_edge_paths
        self.num_chunks = num_chunks
        self.bar: tqdm | None = None
        self.desc = ""
        self.total = 0
        self.started = 0.0

    def step_started(self, it: Iteration, num_edges: int) -> None:
        desc = f"epoch {it.epoch + 1}/{self.num_epochs}"
        if self.num_edge_paths > 1:
            desc += f" set {it.edge_path_idx + 1}/{self.num_edge_paths}"
        if self.num_chunks > 1:
            desc += f" chunk {it.chunk + 1}/{self.num_chunks}"
        self.desc, self.total, self.started = desc, num_edges, time.perf_counter()
        if not self.bars:
            return
        self.bar = tqdm(
            total=num_edges,
            desc=desc,
            unit="edge",
            unit_scale=True,
            leave=True,
            dynamic_ncols=True,
        )

    def training(self, edges: int, loss: float) -> None:
        if self.bar is None:
            return
        self.bar.n = min(edges, self.total)
        elapsed = time.perf_counter() - self.started
        self.bar.set_postfix(
            loss=f"{loss / max(edges, 1):.4f}",
            eps=f"{edges / max(elapsed, 1e-9):,.0f}/s",
            refresh=False,
        )
        self.bar.refresh()

    def step_finished(self, record: StepRecord) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def step_committed(self, record: StepRecord) -> None:
        line = (
            f"{self.desc}: loss {record.stats.loss:.4f}  reg {record.stats.reg:.4f}  "
            f"{record.edges_per_sec:,.0f} edges/s  {record.seconds:.1f}s"
        )
        if record.trainers:  # a distributed step: the figures are every trainer's, merged
            line += f"  ({record.stats.count:,} edges by {record.trainers} trainers)"
        if record.eval_before is not None and record.eval_after is not None:
            before, after = record.eval_before["mrr"], record.eval_after["mrr"]
            line += f"  withheld-edge mrr (sampled) {before:.3f} -> {after:.3f}"
        if self.report is not None:
            self.report(line)
