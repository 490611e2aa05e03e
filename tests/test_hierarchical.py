"""``communication.hierarchical``: with several trainers per host, reduce within the host first,
then one leader per host across hosts.

Four gloo processes on 127.0.0.1 told they are on two hosts (``StrategyEnv.hosts``; a real run
takes them from the host names the ranks announce, which ``BIGEMBED_HOST_ID`` overrides):

* the reduction alone, hierarchical against flat, on the same vectors: the same sums (float
  rounding apart), the same bits on every trainer, and half the bytes between hosts (the flat
  reduction sends ``4 N`` values across the two hosts per call, the leaders ``2 N``), counted
  per peer, so per level;
* ``allreduce`` and ``async_model_average`` end to end with fp32 and int8: the hierarchical and
  flat runs end with the same agreed values (the exact expectation, within one message's
  error), bit-identical on every trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from bigembed.communication.hierarchical import (
    _contiguous_plan,
    host_leaders,
    is_hierarchical,
)
from bigembed.distributed.handshake import HOST_ID_ENV, host_id
from support.strategy_runs import NAMES, NONNEGATIVE, NUMELS, drive, expected, init, load, save
from support.strategy_runs import spawn as spawn_ranks

WORLD, BUCKETS, BATCHES = 4, 2, 12
LAYOUTS = {"blocks": ["a", "a", "b", "b"], "interleaved": ["a", "b", "a", "b"]}
CASES = [(s, p) for s in ("allreduce", "async_model_average") for p in ("fp32", "int8")]
TOL = {"fp32": 2e-5, "int8": 2e-2}


def test_host_grouping() -> None:
    assert host_leaders([0, 1, 2, 3], ["a", "b", "a", "b"]) == {0: 0, 1: 1, 2: 0, 3: 1}
    assert is_hierarchical(["a", "a", "b"])
    assert not is_hierarchical(["a", "a"])  # one host: nothing to save
    assert not is_hierarchical(["a", "b"])  # one trainer per host: the same as flat
    plan = _contiguous_plan([5, 1, 1, 5, 2], [0, 7])
    assert [[seg.tensor for seg in plan.segments[s]] for s in (0, 7)] == [[0, 1, 2], [3, 4]]


def test_host_id_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ID_ENV, "rack3-node1")
    assert host_id() == "rack3-node1"
    monkeypatch.delenv(HOST_ID_ENV)
    assert host_id()


def _reduce(rank: int, hosts: list[str], hierarchical: bool) -> dict[str, Any]:
    """Three reductions of this rank's vectors; the sums and the bytes sent per peer."""
    from bigembed.communication import get_codec
    from bigembed.communication.hierarchical import make_reduce
    from bigembed.communication.param_server import ShardPlan

    trainers = list(range(WORLD))
    plan = ShardPlan(NAMES, NUMELS, trainers, NONNEGATIVE)
    reduce = make_reduce(
        rank, plan, get_codec("fp32"), None, trainers, hosts if hierarchical else None
    )
    gen = torch.Generator().manual_seed(rank)
    sums = []
    for _ in range(3):
        parts = {s: torch.rand(plan.size(s), generator=gen) for s in plan.active_servers}
        sums.append(reduce.reduce(parts))
    return {"sums": sums, "sent_to": dict(reduce.sent_to), "kind": type(reduce).__name__}


def _rank(rank: int, world: int, store: str, out: str) -> None:
    import faulthandler

    import torch.distributed as dist

    side = init(rank, world, store)
    faulthandler.dump_traceback_later(120, exit=True)
    for layout, hosts in LAYOUTS.items():
        for hierarchical in (False, True):
            save(out, f"reduce-{layout}-{hierarchical}", rank, _reduce(rank, hosts, hierarchical))
            dist.barrier(group=side)
    for strategy, precision in CASES:
        for hierarchical in (False, True):
            env = {"hierarchical": hierarchical, "hosts": LAYOUTS["blocks"]}
            result = drive(
                rank, world, side, strategy, precision, buckets=BUCKETS, batches=BATCHES, env=env
            )
            save(out, f"{strategy}-{precision}-{hierarchical}", rank, result)
            dist.barrier(group=side)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("hierarchical")
    spawn_ranks(_rank, WORLD, where)
    return where


def _cross_host(results: list[dict[str, Any]], hosts: list[str]) -> int:
    return sum(
        n
        for rank, res in enumerate(results)
        for peer, n in res["sent_to"].items()
        if hosts[peer] != hosts[rank]
    )


@pytest.mark.integration
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_hierarchical_reduce_sums_the_same_with_half_the_cross_host_bytes(
    runs: Path, layout: str
) -> None:
    hosts = LAYOUTS[layout]
    flat, tree = (load(runs, f"reduce-{layout}-{h}", WORLD) for h in (False, True))
    assert {r["kind"] for r in flat} == {"ShardedReduce"}
    assert {r["kind"] for r in tree} == {"HierarchicalReduce"}
    for call in range(3):
        for owner, got in tree[0]["sums"][call].items():
            want = flat[0]["sums"][call][owner]
            assert float((got - want).abs().max()) <= 1e-5, (call, owner)
            for res in tree[1:]:  # the same bits everywhere
                assert torch.equal(res["sums"][call][owner], got)
    values = sum(NUMELS) * 4 * 3  # fp32 bytes of one vector, three calls
    assert _cross_host(flat, hosts) == 4 * values
    assert _cross_host(tree, hosts) == 2 * values
    # within the hosts: each non-leader sends its vector up, each leader the sums down
    within = sum(
        n
        for rank, res in enumerate(tree)
        for peer, n in res["sent_to"].items()
        if hosts[peer] == hosts[rank]
    )
    assert within == 4 * values


@pytest.mark.integration
@pytest.mark.parametrize(("strategy", "precision"), CASES)
def test_hierarchical_strategy_agrees_with_flat(runs: Path, strategy: str, precision: str) -> None:
    want = expected(WORLD, BUCKETS * BATCHES, mean=strategy == "async_model_average")
    flat, tree = (load(runs, f"{strategy}-{precision}-{h}", WORLD) for h in (False, True))
    assert {r["reduce"] for r in tree} == {"HierarchicalReduce"}
    for results in (flat, tree):
        for res in results:
            assert not res["errors"], res["errors"]
            assert res["rounds"] > 0
            for got, w in zip(res["tensors"], want, strict=True):
                assert float((got.double() - w).abs().max()) <= TOL[precision]
        for res in results[1:]:
            for a, b in zip(results[0]["tensors"], res["tensors"], strict=True):
                assert torch.equal(a, b)
        assert sum(r["sent"] for r in results) == sum(r["received"] for r in results)
    for a, b in zip(flat[0]["tensors"], tree[0]["tensors"], strict=True):
        assert float((a - b).abs().max()) <= 2 * TOL[precision]


@pytest.mark.integration
def test_ranks_told_apart_by_host_id_reduce_hierarchically(tmp_path: Path) -> None:
    """Three hand-started ranks on 127.0.0.1, ``BIGEMBED_HOST_ID`` a, a, b: the host ids travel
    through the join handshake to the strategy, which reduces host by host (its log line), and
    the run ends cleanly; with ``communication.hierarchical=false`` it stays flat."""
    from support.ranks import ENV, free_port, make_graph, start_rank

    cfg_path, _ = make_graph(tmp_path, num_epochs=1)
    for hierarchical in ("true", "false"):
        port = free_port()
        extra = (
            *("-p", "num_machines=3", "-p", "communication.strategy=allreduce"),
            *("-p", f"communication.hierarchical={hierarchical}"),
        )
        procs = [
            start_rank(cfg_path, r, port, *extra, env={**ENV, HOST_ID_ENV: host})
            for r, host in enumerate("aab")
        ]
        outs = [p.communicate(timeout=180)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        said = ["hierarchical reduction, 2 hosts" in out for out in outs]
        assert said == [hierarchical == "true"] * 3, outs
        if hierarchical == "true":
            assert "this host's leader rank 0" in outs[1] and "leader rank 2" in outs[2]
