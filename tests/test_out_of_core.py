"""Out-of-core training: every update survives swapping, in the configured order, in bounded memory.

* A run that swaps partitions to disk must give bit-identical results to a reference run that
  keeps every partition in memory (workers=1, fixed seed): a lost or stale swap shows at once.
* The buckets run in the order ``bucket_order`` gives, read back from training_stats.json.
* With 2 Hogwild workers, the real memory of the trainer and its workers (proportional set size
  from /proc, sampled while training) stays far below "all partitions resident" for a graph
  whose embeddings are several times one partition.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from bigembed.checkpoints.store import CheckpointStore
from bigembed.train.loop import Iteration, _mix
from bigembed.train.memory.bucket_order import bucket_order
from bigembed.train.memory.partitions import PartitionKey, PartitionStore
from bigembed.train.single_machine import Trainer
from support.graphs import budget_for, graph_config, write_graph
from support.tree_memory import train_measured

NPARTS = 4


class InMemoryStore(PartitionStore):
    """The reference: a partition, once loaded, never leaves memory."""

    def evict(self, keep: Iterable[PartitionKey] = ()) -> list[PartitionKey]:
        return []


def _final(cfg) -> dict[str, torch.Tensor]:
    """Every partition's embeddings and Adagrad state, and the model, of the last version."""
    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    out: dict[str, torch.Tensor] = {}
    meta = store.read_metadata(version)
    for p in range(NPARTS):
        count = meta.entity_counts[("node", p)]
        emb, state = torch.empty(count, cfg.dimension), torch.empty(count)
        store.load_partition("node", p, version, emb, state)
        out[f"emb{p}"], out[f"state{p}"] = emb, state
    payload = store.load_model(version)
    out.update({f"model/{k}": v for k, v in payload["model"].items()})
    out.update({f"adagrad/{k}": v for k, v in enumerate(payload["optimizer"])})
    return out


def test_swapping_is_bit_identical_to_all_in_memory(tmp_path: Path) -> None:
    write_graph(tmp_path, num_entities=400, num_edges=4000, num_partitions=NPARTS, seed=4)
    common = {
        "num_partitions": NPARTS,
        "num_epochs": 2,
        "bucket_order": "affinity",
        "seed": 11,
        "workers": 1,
        "num_edge_chunks": 2,
        "eval_fraction": 0.05,
    }
    swap_cfg = graph_config(tmp_path, checkpoint_path=str(tmp_path / "swap"), **common)
    ref_cfg = graph_config(tmp_path, checkpoint_path=str(tmp_path / "ref"), **common)

    swapping = Trainer(swap_cfg, progress=False, capacity=2).train()
    reference = Trainer(ref_cfg, progress=False, partitions_type=InMemoryStore).train()
    per_partition = swapping.total_partition_bytes / NPARTS
    assert swapping.peak_partition_bytes <= 2 * per_partition * 1.05, "the run really swapped"
    assert reference.peak_partition_bytes > 3.5 * per_partition, "the reference never swapped"
    steps = [
        r for r in CheckpointStore(swap_cfg.checkpoint_path).read_stats() if r["type"] == "step"
    ]
    assert len(steps) == 4 and all(s["io_bytes_written"] > 0 for s in steps)

    got, want = _final(swap_cfg), _final(ref_cfg)
    assert got.keys() == want.keys()
    changed = [k for k in want if not torch.equal(got[k], want[k])]
    assert not changed, f"swapping changed {changed}"
    assert CheckpointStore(ref_cfg.checkpoint_path).committed_version() == 4


@pytest.mark.parametrize("order", ["random", "affinity", "inside_out", "outside_in"])
def test_buckets_run_in_the_configured_order(tmp_path: Path, order: str) -> None:
    write_graph(tmp_path, num_entities=400, num_edges=4000, num_partitions=NPARTS)
    cfg = graph_config(tmp_path, num_partitions=NPARTS, num_epochs=3, bucket_order=order, seed=7)
    trainer = Trainer(cfg, progress=False)
    trainer.train()
    edges = trainer.edge_stores[0]
    used: dict[int, list[tuple[int, int]]] = {}
    for r in CheckpointStore(cfg.checkpoint_path).read_stats():
        if r["type"] == "bucket":
            used.setdefault(r["version"], []).append((r["lhs_partition"], r["rhs_partition"]))
            assert r["index"] == len(used[r["version"]]) - 1
    for version, seen in used.items():
        it = Iteration(version - 1, version - 1, 0, 0)
        rng = random.Random(_mix(cfg.seed, 1, it.index))
        expected = [b for b in bucket_order(order, NPARTS, NPARTS, rng) if edges.num_edges(*b)]
        assert seen == expected, (version, order)
    assert sorted(used) == [1, 2, 3]
    assert len({tuple(s) for s in used.values()}) > 1, "each epoch draws a new order"


# ---------------------------------------------------------------------- real memory
@pytest.mark.integration
def test_two_workers_real_memory_stays_out_of_core(tmp_path: Path) -> None:
    """4 partitions of 30 MB (embeddings + Adagrad state) and 2 Hogwild workers: the tables live
    in shared memory, and the process tree's peak of it stays near 2 partitions (a bucket's
    two), far below the 120 MB of all four: a swapped-out partition must be gone before the
    next one is loaded, in the trainer and in every worker. The root's private memory must not
    hold a copy of the whole graph either."""
    entities, dim = 300_000, 99  # (99 + 1) floats per row: 30 MB per partition of 75k
    write_graph(tmp_path, num_entities=entities, num_edges=8000, num_partitions=NPARTS)
    part = entities // NPARTS * (dim + 1) * 4
    cfg = graph_config(
        tmp_path,
        num_partitions=NPARTS,
        dimension=dim,
        num_epochs=1,
        workers=2,
        batch_size=200,
        memory_budget=budget_for(2, part, workers=2, edges=8000),
    )
    _, mem = train_measured(cfg, tmp_path)
    assert len(mem.pids) >= 3, "the trainer and its 2 workers were seen"
    records = [
        r for r in CheckpointStore(cfg.checkpoint_path).read_stats() if r["type"] == "bucket"
    ]
    assert len(records) == 16
    mib = mem.summary(part)
    assert mem.peak_shmem >= 1.9 * part, f"the measure must see the resident tables: {mib}"
    assert mem.peak_shmem <= 2.5 * part, f"more than a bucket's 2 partitions in memory: {mib}"
    # the root's private memory: the interpreter and torch (~150-250 MB) plus transient
    # single-partition buffers (initial values); all partitions held privately would add 120 MB
    assert mem.peak_anon <= 300 * 2**20 + 1.5 * part, mib
