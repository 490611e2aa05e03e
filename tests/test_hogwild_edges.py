"""The Hogwild pool's shared edge arrays (bigembed.train.shared_edges): one buffer reused by
every bucket, grown when a bucket is larger, read by the workers up to the bucket's size."""

from __future__ import annotations

import pytest
import torch

from bigembed.train.shared_edges import SharedEdges


def test_fill_reuses_the_buffer_and_grows_it_when_needed() -> None:
    edges = SharedEdges()
    lhs, rhs, rel = torch.arange(10), torch.arange(10, 20), torch.zeros(10, dtype=torch.long)
    a = edges.fill(lhs, rhs, rel, None)
    assert a.ids.is_shared() and a.weight is None
    assert [t.tolist() for t in a.view(10, False)[:3]] == [lhs.tolist(), rhs.tolist(), [0] * 10]
    order = torch.tensor([4, 3, 2, 1, 0])
    b = edges.fill(lhs[:5], rhs[:5], rel[:5], None, order)  # smaller: same arrays, in order
    assert b is a and b.generation == a.generation
    assert b.view(5, False)[0].tolist() == [4, 3, 2, 1, 0]
    w = torch.linspace(0, 1, 12)
    c = edges.fill(torch.arange(12), torch.arange(12), torch.ones(12, dtype=torch.long), w)
    assert c.generation == a.generation + 1 and c.ids.shape[1] == 12
    assert c.weight is not None and c.weight.is_shared()
    got = c.view(12, True)[3]
    assert got is not None and torch.equal(got, w)
    with pytest.raises(AssertionError):
        c.view(13, False)


def test_workers_train_exactly_the_current_buckets_edges() -> None:
    """Three buckets through a 2-worker pool: 300 edges on rows 0-49, 600 on rows 50-99 (the
    buffer grows), then 100 on rows 0-9 (the buffer holds stale edges past 100). With batch
    negatives only, a bucket changes exactly the rows its edges touch: after the third bucket
    only rows 0-9 moved, so no worker read past the bucket's size or an old buffer."""
    from bigembed.buckets.negative_settings import negative_settings
    from bigembed.config import model_spec, parse_config_dict
    from bigembed.model.scoring import ScoringModel
    from bigembed.train.hogwild import HogwildPool, WorkerSetup
    from bigembed.train.step import Table

    cfg = parse_config_dict(
        {
            "entities": {"node": {"num_partitions": 1}},
            "relations": [{"name": "r", "lhs": "node", "rhs": "node"}],
            "entity_path": "e",
            "edge_paths": ["x"],
            "checkpoint_path": "c",
            "dimension": 8,
            "batch_size": 50,
            "num_batch_negs": 10,
            "num_uniform_negs": 0,
        }
    )
    model = ScoringModel(model_spec(cfg, 1))
    model.share_memory()
    states = [torch.zeros_like(p).share_memory_() for p in model.parameters()]
    setup = WorkerSetup(model, states, negative_settings(cfg), 0.1, 0.0, 50, False)
    table = Table(torch.randn(100, 8).share_memory_(), torch.zeros(100).share_memory_())
    key = ("node", 0)
    gen = torch.Generator().manual_seed(0)
    pool = HogwildPool(setup, 2, steal=True)
    try:
        for n, low, high in [(300, 0, 50), (600, 50, 100), (100, 0, 10)]:
            before = table.emb.clone()
            lhs = torch.randint(low, high, (n,), generator=gen)
            rhs = torch.randint(low, high, (n,), generator=gen)
            rel = torch.zeros(n, dtype=torch.long)
            stats = pool.run({key: table}, [(key, key)], lhs, rhs, rel, None, n)
            assert stats.count == n
            moved = (table.emb != before).any(dim=1).nonzero().squeeze(1)
            assert moved.numel() > 0
            assert int(moved.min()) >= low and int(moved.max()) < high, (n, moved)
    finally:
        pool.close()
