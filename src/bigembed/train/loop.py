"""The training loop: epochs -> edge sets -> edge chunks -> buckets -> Hogwild batches.

It is composed of small parts so that the distributed trainer can reuse it and swap only where
buckets and partitions come from: a :class:`BucketSource` (here, the local ``bucket_order``),
a :class:`~bigembed.train.partitions.PartitionStore`, the
:class:`~bigembed.train.hogwild.HogwildPool` that runs the steps, and the
:class:`~bigembed.checkpoints.store.CheckpointStore` that commits each (epoch, edge set, chunk).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from tqdm import tqdm

from bigembed import __version__
from bigembed.checkpoints.store import CheckpointStore, check_same_import
from bigembed.config import ConfigSchema, config_to_dict
from bigembed.errors import CheckpointError, ConfigError
from bigembed.eval.metrics import RankingSums
from bigembed.model.scoring import ScoringModel
from bigembed.storage.edges import EdgeStore, check_edges_import
from bigembed.storage.entities import EntityStore
from bigembed.train.bucket_order import Bucket, bucket_order
from bigembed.train.evaluation import evaluate_edges, split_eval
from bigembed.train.hogwild import HogwildPool, WorkerSetup
from bigembed.train.partitions import PartitionKey, PartitionSource, PartitionStore
from bigembed.train.settings import negative_settings
from bigembed.train.step import StepStats, Table

logger = logging.getLogger(__name__)


def _mix(*parts: int) -> int:
    """A stable 63-bit seed from integers (Python's hash() of tuples is not stable across runs)."""
    h = 0xCBF29CE484222325
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 0x100000001B3) & 0x7FFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True)
class Iteration:
    """One checkpointed step: (epoch, edge set, edge chunk)."""

    index: int  # 0-based; the checkpoint version after it is index + 1
    epoch: int
    edge_path_idx: int
    chunk: int


def iterations(
    num_epochs: int, num_paths: int, num_chunks: int, start: int = 0
) -> Iterator[Iteration]:
    total = num_epochs * num_paths * num_chunks
    for index in range(start, total):
        epoch, rest = divmod(index, num_paths * num_chunks)
        path_idx, chunk = divmod(rest, num_chunks)
        yield Iteration(index, epoch, path_idx, chunk)


class BucketSource(Protocol):
    """Hands out the buckets of one step (the lock server replaces this in distributed mode)."""

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]: ...


class LocalBucketSource:
    def __init__(self, order: str, seed: int) -> None:
        self.order = order
        self.seed = seed

    def buckets(self, it: Iteration, nparts_lhs: int, nparts_rhs: int) -> Iterator[Bucket]:
        rng = random.Random(_mix(self.seed, 1, it.index))
        yield from bucket_order(self.order, nparts_lhs, nparts_rhs, rng)


# ---------------------------------------------------------------------- results
@dataclass
class TrainResult:
    version: int
    steps_run: int
    edges: int = 0
    seconds: float = 0.0
    last_stats: dict[str, Any] = field(default_factory=dict)
    peak_partition_bytes: int = 0
    total_partition_bytes: int = 0

    @property
    def edges_per_sec(self) -> float:
        return self.edges / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------- the trainer
class Trainer:
    """Single-machine trainer; see the module docstring for the parts it is built from."""

    def __init__(
        self,
        cfg: ConfigSchema,
        *,
        progress: bool = True,
        bucket_source: BucketSource | None = None,
        on_step: Callable[[Iteration, dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.show_progress = progress
        self.on_step = on_step
        self.entities = EntityStore(cfg.entity_path)
        self.edge_stores = [EdgeStore(p) for p in cfg.edge_paths]
        self._check_graph()
        self.checkpoint = CheckpointStore(cfg.checkpoint_path)
        self.bucket_source = bucket_source or LocalBucketSource(cfg.bucket_order, cfg.seed)
        self.num_chunks = self._num_chunks()
        self.num_relations = (
            self.entities.num_relations if cfg.dynamic_relations else len(cfg.relations)
        )
        self.model = ScoringModel(cfg, self.num_relations if cfg.dynamic_relations else 0)
        self.model_states = [torch.zeros_like(p) for p in self.model.parameters()]

    # ------------------------------------------------------------------ checks
    def _check_graph(self) -> None:
        check_edges_import(self.entities, *self.edge_stores)
        cfg = self.cfg
        for etype in {t for r in cfg.relations for t in (r.lhs, r.rhs)}:
            if etype not in self.entities.entity_types:
                raise ConfigError(
                    f"entity type '{etype}' is not in the imported graph at {cfg.entity_path} "
                    f"(it has: {', '.join(sorted(self.entities.entity_types))}); "
                    "re-run bigembed import"
                )
            want = cfg.entities[etype].num_partitions
            have = self.entities.num_partitions(etype)
            if want != have:
                raise ConfigError(
                    f"entities.{etype}.num_partitions: config says {want} but the graph at "
                    f"{cfg.entity_path} was imported with {have}; re-run bigembed import"
                )
        if cfg.dynamic_relations and self.entities.num_relations <= 0:
            raise ConfigError(f"{cfg.entity_path}: no relation types found for dynamic relations")

    def _num_chunks(self) -> int:
        if self.cfg.num_edge_chunks is not None:
            return self.cfg.num_edge_chunks
        biggest = max(
            (s.num_edges(i, j) for s in self.edge_stores for (i, j) in s.buckets()), default=0
        )
        return max(1, math.ceil(biggest / self.cfg.max_edges_per_chunk))

    def _partitions_of(self, side: str) -> int:
        types = {getattr(r, side) for r in self.cfg.relations}
        return max(self.cfg.entities[t].num_partitions for t in types)

    def _sides(self, bucket: Bucket) -> list[tuple[PartitionKey, PartitionKey]]:
        """Per relation index: the (lhs, rhs) partition keys the bucket uses."""
        i, j = bucket
        out = []
        rels = self.cfg.relations if not self.cfg.dynamic_relations else self.cfg.relations[:1]
        for r in rels:
            li = i if self.cfg.entities[r.lhs].num_partitions > 1 else 0
            rj = j if self.cfg.entities[r.rhs].num_partitions > 1 else 0
            out.append(((r.lhs, li), (r.rhs, rj)))
        return out

    # ------------------------------------------------------------------ state
    def _load_model_state(self, committed: int) -> PartitionSource | None:
        cfg = self.cfg
        init_source = None
        if committed > 0:
            payload = self.checkpoint.load_model(committed)
        elif cfg.init_path:
            init_store = CheckpointStore(cfg.init_path)
            init_version = init_store.committed_version()
            if init_version <= 0:
                raise CheckpointError(f"init_path {cfg.init_path}: no committed checkpoint there")
            init_meta = init_store.load_metadata(init_version)
            check_same_import(
                init_store.path, init_meta.get("import_id"), self._import_id(), cfg.entity_path
            )
            payload = init_store.load_model(init_version)
            payload["optimizer"] = None  # warm start: parameters yes, optimizer state no
            init_source = PartitionSource(init_store, init_version)
        else:
            return None
        try:
            self.model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            raise CheckpointError(
                f"{self.checkpoint.path}: model parameters do not fit this config: {exc}"
            ) from None
        if payload.get("optimizer"):
            for state, saved in zip(self.model_states, payload["optimizer"], strict=True):
                state.copy_(saved)
        return init_source

    def _model_payload(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": [s.clone() for s in self.model_states],
        }

    def _metadata(self, it: Iteration) -> dict[str, Any]:
        return {
            "bigembed_version": __version__,
            "config": config_to_dict(self.cfg),
            "iteration": {
                "num_epochs": self.cfg.num_epochs,
                "epoch_idx": it.epoch,
                "num_edge_paths": len(self.cfg.edge_paths),
                "edge_path_idx": it.edge_path_idx,
                "edge_path": self.cfg.edge_paths[it.edge_path_idx],
                "num_edge_chunks": self.num_chunks,
                "edge_chunk_idx": it.chunk,
            },
            "entity_counts": {
                f"{t}_{p}": self.entities.count(t, p)
                for t in self.entities.entity_types
                for p in range(self.entities.num_partitions(t))
            },
            "num_relations": self.num_relations,
            "relation_names": list(self.entities.relation_names()),
            "import_id": self._import_id(),
        }

    def _import_id(self) -> str | None:
        """Which import of the entity path this run trains on (None: imported before ids)."""
        return self.entities.import_id

    # ------------------------------------------------------------------ hooks (the distributed
    # trainer overrides these; see bigembed.distributed.trainer)
    def _open_checkpoint(self) -> int:
        """Drop the files of an interrupted step; returns the committed version."""
        ck = self.checkpoint
        ck.path.mkdir(parents=True, exist_ok=True)
        removed = ck.discard_uncommitted()
        if removed:
            logger.info("removed %d files of an interrupted step in %s", removed, ck.path)
        return ck.committed_version()

    def _make_partition_store(
        self,
        counts: dict[PartitionKey, int],
        dims: dict[str, int],
        committed: int,
        init_source: PartitionSource | None,
        shared: bool,
        pinned: list[PartitionKey],
    ) -> PartitionStore:
        return PartitionStore(
            counts,
            dims,
            self.checkpoint,
            committed=committed,
            working=committed + 1,
            init_source=init_source,
            init_scale=self.cfg.init_scale,
            seed=self.cfg.seed,
            shared=shared,
            pinned=pinned,
        )

    def _save_step(self, it: Iteration, store: PartitionStore) -> None:
        """Write the step's partitions, model and metadata as version ``it.index + 1``."""
        version = it.index + 1
        store.flush()
        self.checkpoint.save_model(version, self._model_payload())
        self.checkpoint.save_metadata(version, self._metadata(it))

    def _commit_step(
        self, it: Iteration, records: list[dict[str, Any]], summary: dict[str, Any]
    ) -> None:
        """Append the step's stats and make its version the committed one."""
        cfg = self.cfg
        ck = self.checkpoint
        version = it.index + 1
        ck.append_stats([*records, summary], committed=it.index)
        ck.write_config(json.dumps(config_to_dict(cfg), indent=1))
        preserve = cfg.checkpoint_preservation_interval
        last_of_epoch = (
            it.edge_path_idx == len(cfg.edge_paths) - 1 and it.chunk == self.num_chunks - 1
        )
        ck.commit(version)
        if preserve and last_of_epoch and (it.epoch + 1) % preserve == 0:
            ck.preserve(version, it.epoch + 1)

    # ------------------------------------------------------------------ run
    def train(self) -> TrainResult:
        cfg = self.cfg
        ck = self.checkpoint
        committed = self._open_checkpoint()
        total_steps = cfg.num_epochs * len(cfg.edge_paths) * self.num_chunks
        if committed > 0:
            meta = ck.load_metadata(committed)
            it = meta.get("iteration", {})
            if it.get("num_edge_chunks") not in (None, self.num_chunks):
                raise CheckpointError(
                    f"{ck.path}: checkpoint was made with {it.get('num_edge_chunks')} edge chunks, "
                    f"the config now gives {self.num_chunks}; set num_edge_chunks to match"
                )
            check_same_import(ck.path, meta.get("import_id"), self._import_id(), cfg.entity_path)
            logger.info("resuming from checkpoint version %d of %d", committed, total_steps)
        result = TrainResult(version=committed, steps_run=0)
        if committed >= total_steps:
            logger.info("training already complete (%d steps) in %s", total_steps, ck.path)
            return result
        init_source = self._load_model_state(committed)
        if cfg.init_path and committed == 0:
            logger.info("warm start from %s", cfg.init_path)

        workers = cfg.resolved_workers()
        counts = {
            (t, p): self.entities.count(t, p)
            for t in self.entities.entity_types
            if t in cfg.entities
            for p in range(self.entities.num_partitions(t))
        }
        dims = {t: cfg.entity_dimension(t) for t in cfg.entities}
        pinned = [
            (t, 0) for t in cfg.entities if cfg.entities[t].num_partitions == 1 and (t, 0) in counts
        ]
        store = self._make_partition_store(
            counts, dims, committed, init_source, workers > 1, pinned
        )
        result.total_partition_bytes = store.total_bytes()
        if workers > 1:
            self.model.share_memory()
            for s in self.model_states:
                s.share_memory_()
        setup = WorkerSetup(
            self.model,
            self.model_states,
            negative_settings(cfg),
            cfg.lr,
            cfg.resolved_relation_lr(),
            cfg.batch_size,
            cfg.dynamic_relations,
        )
        pool = HogwildPool(setup, workers)
        started = time.perf_counter()
        try:
            for it in iterations(cfg.num_epochs, len(cfg.edge_paths), self.num_chunks, committed):
                record = self._run_step(it, store, pool)
                result.steps_run += 1
                result.edges += record["stats"]["count"]
                result.version = it.index + 1
                result.last_stats = record
                if self.on_step:
                    self.on_step(it, record)
        finally:
            pool.close()
        result.seconds = time.perf_counter() - started
        result.peak_partition_bytes = store.peak_bytes
        return result

    def _run_step(self, it: Iteration, store: PartitionStore, pool: HogwildPool) -> dict[str, Any]:
        cfg = self.cfg
        version = it.index + 1
        store.advance(committed=it.index, working=version)
        edges = self.edge_stores[it.edge_path_idx]
        nl, nr = self._partitions_of("lhs"), self._partitions_of("rhs")
        step_edges = sum(
            len(range(*_chunk_bounds(edges.num_edges(i, j), it.chunk, self.num_chunks)))
            for (i, j) in edges.buckets()
        )
        desc = f"epoch {it.epoch + 1}/{cfg.num_epochs}"
        if len(cfg.edge_paths) > 1:
            desc += f" set {it.edge_path_idx + 1}/{len(cfg.edge_paths)}"
        if self.num_chunks > 1:
            desc += f" chunk {it.chunk + 1}/{self.num_chunks}"
        bar = tqdm(
            total=step_edges,
            desc=desc,
            unit="edge",
            unit_scale=True,
            disable=not self.show_progress,
            leave=True,
            dynamic_ncols=True,
        )
        records: list[dict[str, Any]] = []
        step_stats = StepStats()
        eval_before, eval_after = RankingSums(), RankingSums()
        t0 = time.perf_counter()
        base_edges, base_loss = pool.progress()
        bucket_index = 0

        def tick() -> None:
            done, loss = pool.progress()
            done -= base_edges
            bar.n = min(done, step_edges)
            elapsed = time.perf_counter() - t0
            bar.set_postfix(
                loss=f"{(loss - base_loss) / max(done, 1):.4f}",
                eps=f"{done / max(elapsed, 1e-9):,.0f}/s",
                refresh=False,
            )
            bar.refresh()

        for bucket in self.bucket_source.buckets(it, nl, nr):
            i, j = bucket
            n = edges.num_edges(i, j) if bucket in set(edges.buckets()) else 0
            if n == 0:
                continue
            bt = time.perf_counter()
            sides = self._sides(bucket)
            tables = store.ensure({k for pair in sides for k in pair})
            chunk = edges.load_chunk(i, j, it.chunk, self.num_chunks)
            lhs = torch.from_numpy(chunk.lhs.astype("int64", copy=False))
            rhs = torch.from_numpy(chunk.rhs.astype("int64", copy=False))
            rel = torch.from_numpy(chunk.rel.astype("int64", copy=False))
            weight = (
                None
                if chunk.weight is None
                else torch.from_numpy(chunk.weight.astype("float32", copy=False))
            )
            eval_idx, train_idx = split_eval(
                lhs.shape[0], cfg.eval_fraction, _mix(cfg.seed, 2, it.edge_path_idx, it.chunk, i, j)
            )
            shuffle = torch.randperm(
                train_idx.shape[0],
                generator=torch.Generator().manual_seed(_mix(cfg.seed, 3, it.index, i, j)),
            )
            train_idx = train_idx[shuffle]
            record: dict[str, Any] = {
                "type": "bucket",
                "version": version,
                "epoch_idx": it.epoch,
                "edge_path_idx": it.edge_path_idx,
                "edge_chunk_idx": it.chunk,
                "lhs_partition": i,
                "rhs_partition": j,
                "index": bucket_index,
            }
            eval_args = None
            if eval_idx.numel() > 0:
                ew = None if weight is None else weight[eval_idx]
                eval_args = (lhs[eval_idx], rhs[eval_idx], rel[eval_idx], ew)
                before = self._evaluate(tables, sides, eval_args, _mix(cfg.seed, 4, it.index, i, j))
                eval_before.merge(before)
                record["eval_stats_before"] = before.summary()
            tw = None if weight is None else weight[train_idx]
            stats = pool.run(
                tables,
                sides,
                lhs[train_idx],
                rhs[train_idx],
                rel[train_idx],
                tw,
                _mix(cfg.seed, 5, it.index, i, j) % (1 << 40),
                on_wait=tick,
                stagger=cfg.hogwild_delay if it.index == 0 and bucket_index == 0 else 0.0,
            )
            if eval_args is not None:
                after = self._evaluate(tables, sides, eval_args, _mix(cfg.seed, 4, it.index, i, j))
                eval_after.merge(after)
                record["eval_stats_after"] = after.summary()
            seconds = time.perf_counter() - bt
            step_stats.add(stats)
            record["stats"] = _per_edge(stats)
            record["seconds"] = seconds
            record["edges_per_sec"] = stats.count / seconds if seconds > 0 else 0.0
            records.append(record)
            bucket_index += 1
            # Drop this bucket's tables now: held until the next ensure() returns, a partition
            # it swaps out would stay in memory beside the one it loads.
            del tables, eval_args
        tick()
        bar.close()

        self._save_step(it, store)
        seconds = time.perf_counter() - t0
        summary: dict[str, Any] = {
            "type": "step",
            "version": version,
            "epoch_idx": it.epoch,
            "edge_path_idx": it.edge_path_idx,
            "edge_chunk_idx": it.chunk,
            "stats": _per_edge(step_stats),
            "seconds": seconds,
            "edges_per_sec": step_stats.count / seconds if seconds > 0 else 0.0,
            "io_bytes_read": store.bytes_read,
            "io_bytes_written": store.bytes_written,
        }
        if eval_before.count:
            summary["eval_stats_before"] = eval_before.summary()
            summary["eval_stats_after"] = eval_after.summary()
        self._commit_step(it, records, summary)
        if self.show_progress:
            line = (
                f"{desc}: loss {summary['stats']['loss']:.4f}  reg {summary['stats']['reg']:.4f}  "
                f"{summary['edges_per_sec']:,.0f} edges/s  {seconds:.1f}s"
            )
            if eval_before.count:
                line += (
                    f"  eval mrr {summary['eval_stats_before']['mrr']:.3f} -> "
                    f"{summary['eval_stats_after']['mrr']:.3f}"
                )
            tqdm.write(line)
        return summary

    def _evaluate(
        self,
        tables: dict[PartitionKey, Table],
        sides: list[tuple[PartitionKey, PartitionKey]],
        args: tuple[Tensor, Tensor, Tensor, Tensor | None],  # held-out (lhs, rhs, rel, weight)
        seed: int,
    ) -> RankingSums:
        cfg = self.cfg
        negs = negative_settings(cfg, for_eval=True)
        batch = cfg.batch_size
        if negs.num_batch_negs > 0:
            batch = -(-batch // negs.num_batch_negs) * negs.num_batch_negs
        return evaluate_edges(self.model, tables, sides, *args, negs, batch, seed)


def _chunk_bounds(n: int, chunk: int, num_chunks: int) -> tuple[int, int]:
    size = -(-n // num_chunks) if n else 0
    return min(chunk * size, n), min((chunk + 1) * size, n)


def _per_edge(stats: StepStats) -> dict[str, float]:
    n = max(stats.count, 1)
    return {
        "count": stats.count,
        "loss": stats.loss / n,
        "reg": stats.reg / n,
        "violators_lhs": stats.violators_lhs / n,
        "violators_rhs": stats.violators_rhs / n,
    }


def train(cfg: ConfigSchema, *, progress: bool = True) -> TrainResult:
    """Train (or resume training) as the config says; returns a summary."""
    return Trainer(cfg, progress=progress).train()
