"""Training parts in isolation: bucket orders, batching, Adagrad, eval split, iteration order."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.buckets.batching import make_batches
from bigembed.checkpoints.store import CheckpointStore
from bigembed.kernels.optimizers import dense_adagrad_update, row_adagrad_update
from bigembed.train.evaluation import split_eval
from bigembed.train.loop import iterations
from bigembed.train.memory.bucket_order import bucket_order
from bigembed.train.records import (
    BucketRecord,
    StepLog,
    StepRecord,
    merge_step_logs,
    read_training_log,
)

SHAPES = [(4, 4), (3, 5), (6, 1), (1, 6), (1, 1)]


@pytest.mark.parametrize("order", ["random", "affinity", "inside_out", "outside_in"])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_bucket_exactly_once(order: str, shape: tuple[int, int]) -> None:
    nl, nr = shape
    got = bucket_order(order, nl, nr, random.Random(7))
    assert sorted(got) == [(i, j) for i in range(nl) for j in range(nr)]


def test_layer_orders() -> None:
    for seed in range(5):
        inside = bucket_order("inside_out", 4, 4, random.Random(seed))
        outside = bucket_order("outside_in", 4, 4, random.Random(seed))
        assert [min(b) for b in inside] == sorted((min(b) for b in inside), reverse=True)
        assert [min(b) for b in outside] == sorted(min(b) for b in outside)
        # a bucket and its transpose are neighbours
        for order in (inside, outside):
            for k, (i, j) in enumerate(order):
                if i != j:
                    pos = order.index((j, i))
                    assert abs(pos - k) == 1


def test_bucket_order_reproducible() -> None:
    a = bucket_order("random", 4, 4, random.Random(3))
    b = bucket_order("random", 4, 4, random.Random(3))
    assert a == b


def test_affinity_prefers_shared_partitions() -> None:
    order = bucket_order("affinity", 4, 4, random.Random(1))
    shared = sum(bool(set(p) & set(n)) for p, n in itertools.pairwise(order))
    assert shared >= len(order) - 3


def test_relation_grouped_batches_cover_input() -> None:
    n = 1000
    gen = torch.Generator().manual_seed(0)
    rel = torch.randint(3, (n,), generator=gen)
    lhs = torch.arange(n)
    batches = list(make_batches(lhs, lhs.clone(), rel, None, 64, False, np.random.default_rng(0)))
    seen = torch.cat([b.lhs for b in batches])
    assert sorted(seen.tolist()) == list(range(n))
    for b in batches:
        assert len(b) <= 64
        assert set(b.rel.tolist()) == {b.relation_idx}


def test_dynamic_batches_are_contiguous() -> None:
    lhs = torch.arange(10)
    batches = list(make_batches(lhs, lhs, lhs % 3, None, 4, True, np.random.default_rng(0)))
    assert [b.lhs.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_row_adagrad_matches_reference() -> None:
    torch.manual_seed(0)
    table = torch.randn(6, 4)
    state = torch.zeros(6)
    ref_table, ref_state = table.clone(), state.clone()
    idx1, g1 = torch.tensor([0, 2, 2]), torch.randn(3, 4)
    idx2, g2 = torch.tensor([2, 5]), torch.randn(2, 4)
    touched = row_adagrad_update(table, state, [(idx1, g1), (idx2, g2)], lr=0.1)
    assert touched == 3
    dense = torch.zeros(6, 4)
    dense.index_add_(0, torch.cat([idx1, idx2]), torch.cat([g1, g2]))
    for r in (0, 2, 5):
        ref_state[r] += dense[r].pow(2).mean()
        ref_table[r] -= 0.1 * dense[r] / (ref_state[r].sqrt() + 1e-10)
    assert torch.allclose(table, ref_table) and torch.allclose(state, ref_state)
    untouched = [1, 3, 4]
    assert torch.equal(state[untouched], torch.zeros(3))


def test_dense_adagrad_matches_torch() -> None:
    torch.manual_seed(0)
    p1 = torch.nn.Parameter(torch.randn(5))
    p2 = torch.nn.Parameter(p1.detach().clone())
    opt = torch.optim.Adagrad([p2], lr=0.05, eps=1e-10)
    state = torch.zeros(5)
    for _ in range(4):
        g = torch.randn(5)
        p1.grad = g.clone()
        p2.grad = g.clone()
        dense_adagrad_update([p1], [state], 0.05)
        opt.step()
    assert torch.allclose(p1, p2, atol=1e-6)


def test_adagrad_steps_stay_finite_and_bounded_on_a_slightly_negative_accumulator() -> None:
    """A lossy shared-parameter exchange (int8) can leave a shared accumulator a little below
    0 for a moment; the step must then be that of a fresh accumulator, never NaN."""
    torch.manual_seed(0)
    table, grad = torch.zeros(3, 4), torch.randn(2, 4)
    state = torch.tensor([-1e-3, 0.0, -5.0])
    row_adagrad_update(table, state, [(torch.tensor([0, 2]), grad)], lr=0.1)
    assert bool(torch.isfinite(table).all())
    fresh = torch.zeros(3, 4)
    row_adagrad_update(fresh, torch.zeros(3), [(torch.tensor([0, 2]), grad)], lr=0.1)
    assert torch.allclose(table, fresh)
    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.randn(4)
    expected = -0.1 * torch.sign(param.grad)
    dense_adagrad_update([param], [torch.full((4,), -1e-3)], 0.1)
    assert torch.allclose(param.detach(), expected)


def test_eval_split_is_stable_and_disjoint() -> None:
    e1, t1 = split_eval(1000, 0.05, seed=11)
    e2, _ = split_eval(1000, 0.05, seed=11)
    assert torch.equal(e1, e2) and e1.numel() == 50
    assert set(e1.tolist()).isdisjoint(t1.tolist())
    assert e1.numel() + t1.numel() == 1000
    assert split_eval(1000, 0.0, seed=1)[0].numel() == 0


def test_iteration_order_and_resume() -> None:
    its = list(iterations(2, 3, 2))
    assert len(its) == 12
    assert [(i.epoch, i.edge_path_idx, i.chunk) for i in its[:4]] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
    ]
    resumed = list(iterations(2, 3, 2, start=7))
    assert resumed == its[7:]


# ---------------------------------------------------------------------- stats records
def _bucket_json(**extra) -> dict:
    return {
        "type": "bucket",
        "version": 3,
        "epoch_idx": 1,
        "edge_path_idx": 0,
        "edge_chunk_idx": 1,
        "lhs_partition": 2,
        "rhs_partition": 0,
        "index": 4,
        "stats": {"count": 10, "loss": 0.5, "reg": 0.0, "violators_lhs": 0.1, "violators_rhs": 0.2},
        "seconds": 2.0,
        "edges_per_sec": 5.0,
        **extra,
    }


def _step_json(count: int, loss: float, seconds: float, **extra) -> dict:
    stats = {"count": count, "loss": loss, "reg": 0.0, "violators_lhs": 0.0, "violators_rhs": 0.0}
    return {
        "type": "step",
        "version": 3,
        "epoch_idx": 1,
        "edge_path_idx": 0,
        "edge_chunk_idx": 1,
        "stats": stats,
        "seconds": seconds,
        "edges_per_sec": count / seconds,
        "io_bytes_read": 100,
        "io_bytes_written": 50,
        **extra,
    }


EVAL = {"count": 4, "mr": 2.0, "mrr": 0.5, "hits@1": 0.25, "hits@10": 1.0, "auc": 0.9}


@pytest.mark.parametrize(
    "data",
    [
        _bucket_json(),
        _bucket_json(eval_stats_before=EVAL, eval_stats_after=EVAL, trainer=1),
        _step_json(10, 0.5, 2.0),
        _step_json(10, 0.5, 2.0, net_bytes=7, lock_waits=1, trainers=2, eval_stats_after=EVAL),
    ],
)
def test_stats_record_json_form_is_the_file_form(data: dict) -> None:
    """Every key of training_stats.json survives from_json -> to_json, and nothing is added."""
    kind = BucketRecord if data["type"] == "bucket" else StepRecord
    assert kind.from_json(data).to_json() == data


def test_merge_step_logs_adds_counts_and_weights_means() -> None:
    bucket = BucketRecord.from_json(_bucket_json())
    a = StepLog(
        [bucket],
        StepRecord.from_json(
            _step_json(30, 1.0, 2.0, net_bytes=5, lock_waits=1, io_wait_seconds=0.25)
        ),
    )
    b = StepLog(
        [bucket, bucket],
        StepRecord.from_json(
            _step_json(
                10, 3.0, 4.0, net_bytes=7, lock_waits=0, eval_stats_after=EVAL, io_wait_seconds=0.5
            )
        ),
    )
    merged = merge_step_logs([a, b])
    step = merged.step.to_json()
    assert step["stats"]["count"] == 40 and step["stats"]["loss"] == pytest.approx(1.5)
    assert step["seconds"] == 4.0 and step["edges_per_sec"] == 10.0
    assert (step["io_bytes_read"], step["net_bytes"], step["lock_waits"]) == (200, 12, 1)
    assert step["trainers"] == 2
    assert step["io_wait_seconds"] == 0.75, "the trainers' partition I/O waits are summed"
    assert step["eval_stats_after"] == {**EVAL, "count": 4}
    assert "eval_stats_before" not in step
    assert [r.trainer for r in merged.buckets] == [0, 1, 1]
    assert a.buckets[0].trainer is None, "the trainers' own logs are left as they were"
    plain = StepLog([], StepRecord.from_json(_step_json(10, 1.0, 1.0)))
    assert merge_step_logs([plain, plain]).step.io_wait_seconds is None, "no wait recorded"


def test_training_log_reads_what_a_commit_wrote(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    step = StepRecord.from_json(_step_json(10, 0.5, 2.0))
    log = StepLog([BucketRecord.from_json(_bucket_json())], step)
    store.append_stats([*log.to_json(), {"type": "unknown", "version": 3}], committed=0)
    text = (tmp_path / "training_stats.json").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[:2] == log.to_json()
    read = read_training_log(store)
    assert read.steps == [log.step] and read.buckets == log.buckets
    assert read.buckets_of(3) == log.buckets and read.buckets_of(2) == []
    assert read_training_log(store, max_version=2).steps == []
