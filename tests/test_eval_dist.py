"""Distributed evaluation: shares from Bagua's sampler, the merge, and real ranks.

In process: the shares are disjoint, cover the edges and balance their cost; ranking the shares
and merging gives the one-machine ranks and report exactly; the edge costs follow the candidate
types and the operators. With real processes on 127.0.0.1 (integration): ``bigembed eval
--rank R`` started by hand and ``bigembed launch -n 2 --eval`` write the one-machine report,
each rank having ranked only its share.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from bigembed.config import ConfigSchema
from bigembed.eval import (
    EvalReport,
    edge_costs,
    eval_shares,
    evaluate_checkpoint,
    merge_rankings,
    prepare_evaluation,
)
from bigembed.sampling import even_split
from support.checkpoints import (
    USER_ITEM_RELATIONS,
    TrainedRing,
    user_item_config,
    write_checkpoint,
    write_config_file,
    write_graph,
)
from support.ranks import CLI, ENV, TIMEOUT, free_port, run


class Graph(NamedTuple):
    config: ConfigSchema
    config_file: Path
    test: str


@pytest.fixture(scope="module")
def random_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """Two entity types (users in 2 partitions, items in 1), a linear and a translation
    relation, random embeddings and 151 random test edges: ranks spread widely, raw and
    filtered, so a merge that misplaces one shows."""
    root = tmp_path_factory.mktemp("random_graph")
    rng = np.random.default_rng(4)
    users = [f"u{i}" for i in range(40)]
    items = [f"i{i}" for i in range(25)]

    def edges(n: int) -> list[tuple[str, str, str]]:
        out = []
        for _ in range(n):
            if rng.random() < 0.5:
                out.append((str(rng.choice(users)), "buys", str(rng.choice(items))))
            else:
                out.append((str(rng.choice(users)), "follows", str(rng.choice(users))))
        return out

    write_graph(
        root,
        {"user": [users[:22], users[22:]], "item": [items]},
        ["buys", "follows"],
        {"train": edges(400), "test": edges(151)},
        dynamic=False,
        rel_types=USER_ITEM_RELATIONS,
    )
    cfg = user_item_config(root).model_copy(update={"dimension": 8})
    emb = {
        ("user", 0): rng.normal(size=(22, 8)),
        ("user", 1): rng.normal(size=(18, 8)),
        ("item", 0): rng.normal(size=(25, 8)),
    }
    write_checkpoint(
        cfg,
        emb,
        ["buys", "follows"],
        params={
            "rhs_operators.0.linear_transformation": torch.randn(8, 8),
            "rhs_operators.1.translation": torch.randn(8),
            "global_embs.user": torch.randn(8),
        },
    )
    return Graph(cfg, write_config_file(cfg, root / "config.json"), str(root / "test"))


def _comparable(report: EvalReport | dict[str, Any]) -> dict[str, Any]:
    data = report.to_json() if isinstance(report, EvalReport) else dict(report)
    data.pop("seconds")
    return data


def test_shares_are_disjoint_cover_every_edge_and_balance_the_cost() -> None:
    # two relations: 30 edges of cost 100 (a large candidate type), 70 of cost 1, in blocks
    costs = torch.tensor([100] * 30 + [1] * 70)
    for num_ranks in (1, 2, 3, 7):
        shares = eval_shares(costs, num_ranks)
        together = np.concatenate(shares)
        assert sorted(together.tolist()) == list(range(100)), num_ranks
        assert all(list(s) == sorted(s) for s in shares)
        totals = [int(costs[torch.from_numpy(s)].sum()) for s in shares]
        # the padding repeats (ranked once) make at most one item of difference more
        assert max(totals) - min(totals) <= 2 * 100, (num_ranks, totals)
    # an even split of the same list gives one rank all the costly edges
    even = [int(costs[s].sum()) for s in even_split(100, 2)]
    assert even == [30 * 100 + 20, 50]
    balanced = [int(costs[torch.from_numpy(s)].sum()) for s in eval_shares(costs, 2)]
    assert balanced == [1535, 1535]


def test_merged_share_rankings_give_the_one_machine_report(random_graph: Graph) -> None:
    cfg, test = random_graph.config, [random_graph.test]
    evaluation = prepare_evaluation(cfg, test, per_relation=True)
    whole, _ = evaluation.rank()
    n = len(evaluation.edges)
    assert whole.rhs is not None and whole.rhs.filtered is not None
    assert len(set(whole.rhs.raw.tolist())) > 10 and len(set(whole.rhs.filtered.tolist())) > 10
    for num_ranks in (2, 3):
        shares = eval_shares(edge_costs(evaluation), num_ranks)
        parts = [(rows, evaluation.rank(rows)[0]) for rows in shares]
        merged = merge_rankings(n, parts)
        for side in ("lhs", "rhs"):
            a, b = whole.side(side), merged.side(side)
            assert a is not None and b is not None
            for field in ("raw", "candidates", "filtered", "removed"):
                assert getattr(a, field).tolist() == getattr(b, field).tolist(), (side, field)
        one = evaluate_checkpoint(cfg, test, per_relation=True)
        assert _comparable(evaluation.report(merged)) == _comparable(one)
    rows = eval_shares(edge_costs(evaluation), 2)
    with pytest.raises(ValueError, match="ranked twice"):
        merge_rankings(n, [(rows[0], evaluation.rank(rows[0])[0])] * 2)
    with pytest.raises(ValueError, match="1 missing"):
        cut = rows[1][:-1]
        merge_rankings(n, [(rows[0], evaluation.rank(rows[0])[0]), (cut, evaluation.rank(cut)[0])])


def test_edge_costs_are_candidates_times_dimension_plus_the_operator(tmp_path: Path) -> None:
    test = [("u0", "buys", "i2"), ("u3", "follows", "u1"), ("u4", "buys", "i0")]
    write_graph(
        tmp_path,
        {"user": [["u0", "u1", "u2"], ["u3", "u4"]], "item": [["i0", "i1", "i2", "i3"]]},
        ["buys", "follows"],
        {"train": test, "test": test},
        dynamic=False,
        rel_types=USER_ITEM_RELATIONS,
    )
    cfg = user_item_config(tmp_path)  # d = 3; buys: linear user -> item; follows: translation
    rng = np.random.default_rng(0)
    emb = {("user", 0): rng.normal(size=(3, 3)), ("user", 1): rng.normal(size=(2, 3))}
    emb[("item", 0)] = rng.normal(size=(4, 3))
    write_checkpoint(cfg, emb, ["buys", "follows"])
    evaluation = prepare_evaluation(cfg, [tmp_path / "test"])
    costs = edge_costs(evaluation)
    # buys: heads among 5 users (5 * 3 scores) and tails among 4 items (4 * 3), the linear
    # operator (3 * 3) on each side's anchor: 15 + 9 + 12 + 9 = 45; follows: 5 users on both
    # sides, translation (3): 2 * (15 + 3) = 36
    expected = np.where(evaluation.edges.rel == 0, 45, 36)
    assert costs.tolist() == expected.tolist()
    assert sorted(costs.tolist()) == [36, 45, 45]


def _rank_cmd(config: Path, rank: int, port: int, *extra: str) -> list[str]:
    return [
        *CLI,
        "eval",
        str(config),
        "--rank",
        str(rank),
        "--no-progress",
        "-p",
        "num_machines=2",
        "-p",
        f"distributed_init_method=tcp://127.0.0.1:{port}",
        "-p",
        f"distributed_timeout={TIMEOUT}",
        *extra,
    ]


@pytest.mark.integration
def test_two_ranks_started_by_hand_write_the_one_machine_report(
    random_graph: Graph, tmp_path: Path
) -> None:
    graph = random_graph
    one = evaluate_checkpoint(graph.config, [graph.test], per_relation=True)
    out = tmp_path / "report.json"
    port = free_port()
    args = ("--edges", graph.test, "--per-relation", "--output", str(out))
    procs = [
        subprocess.Popen(
            _rank_cmd(graph.config_file, r, port, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
            start_new_session=True,
        )
        for r in (1, 0)
    ]
    outputs = []
    for p in procs:
        text, _ = p.communicate(timeout=180)
        outputs.append(text)
        assert p.returncode == 0, text
    rank1, rank0 = outputs
    assert _comparable(json.loads(out.read_text())) == _comparable(one)
    # each rank ranked its own share only: ceil(151 / 2) = 76 groups of 2, the last padded with
    # the cheapest edge, which rank 0 already has (rank 1 leaves the repeat out)
    assert "Rank 1: ranked 75 of the 151 edges; rank 0 reports" in rank1
    assert "Rank 0: ranked 76 of the 151 edges; the report merges" in rank0
    assert "MRR" in rank0 and "MRR" not in rank1


@pytest.mark.integration
def test_launch_runs_a_distributed_eval(trained_checkpoint: TrainedRing, tmp_path: Path) -> None:
    ring = trained_checkpoint
    test = str(ring.root / "test")
    out = tmp_path / "report.json"
    done = run(
        [
            "launch",
            str(ring.config_file),
            "-n",
            "2",
            "-p",
            f"distributed_timeout={TIMEOUT}",
            "--eval",
            "--edges",
            test,
            "--output",
            str(out),
        ],
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    one = evaluate_checkpoint(ring.config, [test])
    assert _comparable(json.loads(out.read_text())) == _comparable(one)
    assert "2 eval ranks + 0 partition servers" in done.stdout
    assert done.stdout.count("ranked 12 of the 24 edges") == 2


@pytest.mark.integration
def test_user_errors_of_a_distributed_eval_are_one_line(
    trained_checkpoint: TrainedRing, tmp_path: Path
) -> None:
    ring = trained_checkpoint
    alone = run(["eval", str(ring.config_file), "--rank", "0", "--no-progress"])
    assert alone.returncode != 0 and "num_machines >= 2" in alone.stderr
    assert "Traceback" not in alone.stderr
    sampled = run(
        [*_rank_cmd(ring.config_file, 0, free_port(), "--protocol", "sampled")][len(CLI) :]
    )
    assert sampled.returncode != 0 and "runs on one machine only" in sampled.stderr
    assert "Traceback" not in sampled.stderr


@pytest.mark.integration
def test_ranks_with_different_edges_all_stop_naming_it(random_graph: Graph, tmp_path: Path) -> None:
    graph = random_graph
    port = free_port()
    train = str(Path(graph.test).parent / "train")
    procs = [
        subprocess.Popen(
            _rank_cmd(graph.config_file, r, port, "--edges", edges),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
            start_new_session=True,
        )
        for r, edges in ((0, graph.test), (1, train))
    ]
    for p in procs:
        text, _ = p.communicate(timeout=180)
        assert p.returncode != 0, text
        assert "bigembed eval: error: the ranks evaluate different inputs" in text, text
        assert "151 edges" in text and "400 edges" in text and "Traceback" not in text
