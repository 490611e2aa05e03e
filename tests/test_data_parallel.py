"""Data-parallel training (``distributed_mode: data_parallel``): every trainer a replica.

Unit tier: a replica's share of a bucket (every batch trained once over the replicas, the
sampler's cost alignment, the even split), the replicas' digest. Integration tier (real
processes): a 1-partition graph trains on both ranks with every strategy and the replicas end
bit-equal; a 4-partition graph swaps through each replica's own directory; resume takes rank
0's values; the checkpoint loads and answers like a one-machine one.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigembed.checkpoints import CheckpointStore
from bigembed.config import parse_config_dict
from bigembed.distributed.data_parallel import make_scratch
from bigembed.distributed.replica_sync import digest
from bigembed.output_paths import STAGING_MARKER
from bigembed.train import Iteration, ReplicaShare, TrainingJob
from support.graphs import graph_config, save_config, write_graph
from support.ranks import TIMEOUT, run

# ---------------------------------------------------------------------- unit tier


class _Pool:
    """Stands in for HogwildPool.prepare_planned: records what a replica would train."""

    def prepare_planned(
        self, edges: Any, order: torch.Tensor, plan: np.ndarray, seed: int, claims: Any = None
    ) -> Any:
        assert claims is None  # no store: the fixed split
        return order, plan


class _Job:
    """The parts of a TrainingJob a ReplicaShare reads: the config, one 200-row partition."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        settings = {"batch_size": 50, "dynamic_relations": False, **overrides}
        self.cfg = graph_config(tmp_path, **settings)

    def partition_counts(self) -> dict[tuple[str, int], int]:
        return {("node", 0): 200}


def _job(tmp_path: Path, **overrides: Any) -> TrainingJob:
    return _Job(tmp_path, **overrides)  # type: ignore[return-value]


def _edges(n: int, rels: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lhs = torch.randint(0, 200, (n,), generator=g)
    rhs = torch.randint(0, 200, (n,), generator=g)
    rel = torch.randint(0, rels, (n,), generator=g)
    return lhs, rhs, rel, None


def _shares(job: TrainingJob, replicas: int, edges: tuple, it_index: int = 0) -> list[tuple]:
    it = Iteration(index=it_index, epoch=it_index, edge_path_idx=0, chunk=0)
    out = []
    for r in range(replicas):
        share = ReplicaShare(job, r, replicas)
        out.append(share.prepare(it, (0, 0), _Pool(), edges, seed=5))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("split", ["load_balancing", "even"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_every_edge_is_trained_once_over_the_replicas(
    tmp_path: Path, split: str, replicas: int
) -> None:
    job = _job(tmp_path, communication={"edge_split": split})
    edges = _edges(2017, 1)
    shares = _shares(job, replicas, edges)
    trained = torch.cat([order for order, _ in shares])
    assert sorted(trained.tolist()) == list(range(2017))  # each edge once, none lost
    for order, plan in shares:  # the plan covers the replica's order exactly, in batches
        assert plan[0, 0] == 0 and plan[-1, 1] == order.shape[0]
        assert (plan[1:, 0] == plan[:-1, 1]).all()
    counts = [plan.shape[0] for _, plan in shares]
    assert max(counts) - min(counts) <= 1


def _skewed_job(tmp_path: Path, split: str) -> TrainingJob:
    """Relation 0 is ``linear`` (d² per edge), relation 1 ``diagonal`` (d): a skewed bucket."""
    job = _Job(tmp_path, batch_size=20, dimension=64, communication={"edge_split": split})
    data = job.cfg.model_dump()
    data["relations"] = [
        {"name": "lin", "lhs": "node", "rhs": "node", "operator": "linear"},
        {"name": "diag", "lhs": "node", "rhs": "node", "operator": "diagonal"},
    ]
    job.cfg = parse_config_dict(data)
    return job  # type: ignore[return-value]


def _step_costs(job: TrainingJob, shares: list[tuple], edges: tuple) -> np.ndarray:
    """Per replica, the cost of its k-th batch (rows: replicas, columns: batch positions)."""
    per_edge, _ = ReplicaShare(job, 0, 2).relation_costs((0, 0))
    rel = edges[2].numpy()
    n = min(plan.shape[0] for _, plan in shares)
    out = np.zeros((len(shares), n))
    for r, (order, plan) in enumerate(shares):
        for k in range(n):
            out[r, k] = per_edge[rel[order[plan[k, 0] : plan[k, 1]].numpy()]].sum()
    return out


def test_the_sampler_aligns_the_replicas_costs_step_by_step(tmp_path: Path) -> None:
    """At every batch position the replicas' batches cost about the same with the sampler;
    an even split (the same batches, cut into contiguous slices) leaves them apart. What makes
    a synchronous round wait is the difference of the replicas' costs since the last round."""
    edges = _edges(6000, 2, seed=3)
    gaps = {}
    for split in ("load_balancing", "even"):
        job = _skewed_job(tmp_path / split, split)
        costs = _step_costs(job, _shares(job, 2, edges), edges)
        rounds = costs[:, : costs.shape[1] // 8 * 8].reshape(2, -1, 8).sum(axis=2)
        gaps[split] = float(np.abs(rounds[0] - rounds[1]).sum())
    assert gaps["load_balancing"] * 4 < gaps["even"], gaps


def test_the_assignment_is_the_same_on_every_replica_and_changes_with_the_epoch(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path)
    costs = np.random.default_rng(0).integers(1, 100, 40).astype(np.float64)
    it0 = Iteration(index=0, epoch=0, edge_path_idx=0, chunk=0)
    it1 = Iteration(index=1, epoch=1, edge_path_idx=0, chunk=0)
    views = [ReplicaShare(job, r, 2).assignment(it0, (0, 0), costs) for r in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(views[0], views[1], strict=True))
    later = ReplicaShare(job, 0, 2).assignment(it1, (0, 0), costs)
    assert not torch.equal(later[0], views[0][0])


def test_a_killed_replicas_scratch_is_removed_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a directory with the scratch name pattern and a marker whose process is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale, claim = make_scratch(1)
    claim.release()  # as if its process had been killed: no lock held ...
    marker = stale / STAGING_MARKER
    info = json.loads(marker.read_text())
    marker.write_text(json.dumps({**info, "pid": 2**22 + 1}))  # ... and no such process
    (stale / "embeddings_node_0.v1.npy").write_bytes(b"x")
    unmarked = tmp_path / "bigembed-replica1-user"
    unmarked.mkdir()
    running, held = make_scratch(2)  # this process's, its lock held
    fresh, _ = make_scratch(1)
    assert not stale.exists() and unmarked.exists() and running.exists() and fresh.exists()
    held.release()


def test_digest_tells_equal_bits_from_different_ones() -> None:
    a = torch.randn(100, 8)
    b = a.clone()
    assert digest([a]) == digest([b])
    b[7, 3] = torch.nextafter(b[7, 3], torch.tensor(1e9))
    assert digest([a]) != digest([b])


# ---------------------------------------------------------------------- integration tier

_REPLICAS = re.compile(
    r"replicas \((\w+), (\w+)\): (\d+) rounds, (\d+) bytes sent, (\d+) received, (\d+) repairs; "
    r"changes (\w+)"
)


def _config(root: Path, parts: int, name: str, **overrides: Any) -> tuple[Path, Any]:
    if not (root / "edges").exists():
        write_graph(root, num_entities=300, num_edges=12000, num_partitions=parts, seed=3)
    settings: dict[str, Any] = {"num_epochs": 3, **overrides}
    cfg = graph_config(
        root,
        num_partitions=parts,
        dimension=16,
        eval_fraction=0.1,
        distributed_mode="data_parallel",
        distributed_timeout=4 * TIMEOUT,
        checkpoint_path=str(root / name),
        **settings,
    )
    return save_config(root, cfg), cfg


def _launch(cfg_path: Path, *params: str) -> str:
    argv = ["launch", str(cfg_path), "-n", "2"]
    for p in params:
        argv += ["-p", p]
    out = run(argv, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def _buckets_by_trainer(cfg: Any) -> dict[int, int]:
    edges: dict[int, int] = {}
    for r in CheckpointStore(cfg.checkpoint_path).read_stats():
        if r["type"] == "bucket":
            edges[r["trainer"]] = edges.get(r["trainer"], 0) + r["stats"]["count"]
    return edges


@pytest.mark.integration
@pytest.mark.parametrize(
    "strategy,precision",
    [  # every strategy once (async_model_average is allreduce's averaging form: one covers it)
        ("allreduce", "fp32"),
        ("decentralized", "int8"),
        ("async_ps", "fp32"),
        ("async_decentralized", "fp32"),
    ],
)
def test_one_partition_trains_on_both_replicas(
    tmp_path: Path, strategy: str, precision: str
) -> None:
    cfg_path, cfg = _config(tmp_path, 1, f"{strategy}-{precision}")
    # allreduce with the fixed split (the sampler's shares), the others taking each other's
    # batches (replica_stealing, the default): the counts follow the ranks' speeds
    stealing = strategy != "allreduce"
    out = _launch(
        cfg_path,
        f"communication.strategy={strategy}",
        f"communication.precision={precision}",
        f"communication.replica_stealing={str(stealing).lower()}",
    )
    lines = _REPLICAS.findall(out)
    assert len(lines) == 2, out  # one summary per replica
    for _, _, rounds, sent, _, repairs, merge in lines:
        assert int(rounds) > 0 and int(sent) > 0, out  # the replicas exchanged
        # replicas of one bucket average their changes; only a parameter server adds pushes
        assert merge == ("summed" if strategy == "async_ps" else "averaged"), out
        if strategy != "async_ps":  # the agreement itself leaves them bit-equal
            assert int(repairs) == 0, out
    share = _buckets_by_trainer(cfg)
    assert set(share) == {0, 1} and min(share.values()) > 0, share  # both trained
    if not stealing:  # the sampler's shares: each about half of every epoch (with stealing the
        # counts follow the ranks' speeds, which the machine's other load decides)
        assert abs(share[0] - share[1]) <= 0.1 * (share[0] + share[1]), share
    store = CheckpointStore(cfg.checkpoint_path)
    assert store.committed_version() == 3
    steps = [r for r in store.read_stats() if r["type"] == "step"]
    assert all(s["mode"] == "data_parallel" and s["trainers"] == 2 for s in steps)
    assert steps[-1]["stats"]["count"] == 12000 - 1200  # every training edge once per epoch


@pytest.mark.integration
def test_partitions_swap_through_each_replica_and_resume_takes_rank0s_values(
    tmp_path: Path,
) -> None:
    """4 partitions, 2 held at a time (a buffer of 2 per side): every replica swaps through its
    own directory (rank 1's scratch is removed at the end; rank 0's is the checkpoint). Then
    the run goes on for one more epoch from the committed checkpoint: rank 1 starts from rank
    0's values, so the replicas agree again without a repair."""
    from bigembed.cli import main as cli_main

    cfg_path, cfg = _config(tmp_path, 4, "model", bucket_order="buffer", num_epochs=2)
    out = _launch(cfg_path, "communication.strategy=allreduce")
    assert [int(x[5]) for x in _REPLICAS.findall(out)] == [0, 0], out
    assert set(_buckets_by_trainer(cfg)) == {0, 1}
    assert CheckpointStore(cfg.checkpoint_path).committed_version() == 2
    out = _launch(cfg_path, "communication.strategy=allreduce", "num_epochs=3")
    assert "resuming from checkpoint version 2" in out, out
    assert [int(x[5]) for x in _REPLICAS.findall(out)] == [0, 0], out
    store = CheckpointStore(cfg.checkpoint_path)
    assert store.committed_version() == 3
    scratch = re.findall(r"keeps its swapped partitions in (\S+)", out)
    assert scratch and not any(Path(s).exists() for s in scratch), out
    assert cli_main(["eval", str(cfg_path), "--no-progress"]) == 0  # loads like any checkpoint
