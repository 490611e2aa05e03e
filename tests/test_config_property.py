"""Random valid-looking configs, end to end through the CLI: each trains or is refused early.

Hypothesis draws a config (operators, comparator, loss, negatives, partitions, entity types,
global embeddings, relation weights, edge chunks, bucket order, workers, relation mode,
dimension) and a tiny graph of names that fits it. Every draw must either be refused when the
config is loaded (``bigembed import`` exits 2 with an ``error:`` line per problem, each naming
the config file and key) or
import, train one epoch and evaluate, each command exiting 0. A crash anywhere (a traceback,
an abort) is a bug.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bigembed.cli import main as cli_main

pytestmark = pytest.mark.integration  # each drawn config runs the CLI; some with Hogwild workers

OPERATORS = ("none", "diagonal", "translation", "linear", "affine", "complex_diagonal")
COMPARATORS = ("dot", "cos", "l2", "squared_l2")
LOSSES = ("ranking", "logistic", "softmax")
BUCKET_ORDERS = ("random", "affinity", "inside_out", "outside_in")


rarely = st.sampled_from([False, False, False, True])


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    dynamic = draw(st.booleans())
    types = ["a"] if dynamic or draw(st.booleans()) else ["a", "b"]
    partitions = {t: draw(st.sampled_from([1, 1, 2, 3])) for t in types}
    num_relations = draw(st.integers(1, 3))
    relations = []
    for i in range(1 if dynamic else num_relations):
        lhs, rhs = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        relations.append(
            {
                "name": f"r{i}",
                "lhs": lhs,
                "rhs": rhs,
                "operator": draw(st.sampled_from(OPERATORS)),
                "weight": draw(st.sampled_from([1.0, 0.5, 2.0])),
                "all_negs": draw(rarely),
            }
        )
    return {
        "dynamic": dynamic,
        "num_relations": num_relations,
        "seed": draw(st.integers(0, 1000)),
        "config": {
            "entities": {t: {"num_partitions": n} for t, n in partitions.items()},
            "relations": relations,
            "dynamic_relations": dynamic,
            "dimension": draw(st.sampled_from([8, 8, 8, 7])),
            "comparator": draw(st.sampled_from(COMPARATORS)),
            "loss_fn": draw(st.sampled_from(LOSSES)),
            "global_emb": draw(st.sampled_from([False, False, True])),
            "num_batch_negs": draw(st.integers(0, 12)),
            "num_uniform_negs": draw(st.integers(0, 12)),
            "disable_lhs_negs": draw(rarely),
            "disable_rhs_negs": draw(rarely),
            "num_edge_chunks": draw(st.sampled_from([None, 1, 2])),
            "bucket_order": draw(st.sampled_from(BUCKET_ORDERS)),
            "workers": draw(st.sampled_from([1, 1, 1, 1, 2])),
            "batch_size": draw(st.sampled_from([7, 32, 1000])),
            "regularization_coef": draw(st.sampled_from([0.0, 0.0, 1e-3])),
            "eval_fraction": draw(st.sampled_from([0.0, 0.1])),
            "num_epochs": 1,
        },
    }


def write_edges(path: Path, setup: dict[str, Any], num_edges: int = 150) -> None:
    """Edges of names ``<type>_<i>`` that fit the relations' entity types."""
    rng = np.random.default_rng(setup["seed"])
    cfg = setup["config"]
    lines = []
    for _ in range(num_edges):
        if setup["dynamic"]:
            rel = cfg["relations"][0]
            name = f"d{rng.integers(setup['num_relations'])}"
        else:
            rel = cfg["relations"][rng.integers(len(cfg["relations"]))]
            name = rel["name"]
        lhs = f"{rel['lhs']}_{rng.integers(30)}"
        rhs = f"{rel['rhs']}_{rng.integers(30)}"
        lines.append(f"{lhs}\t{name}\t{rhs}\n")
    path.write_text("".join(lines))


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(argv)
    return rc, err.getvalue()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same draws on every run: a failure is reproducible
)
@given(setup=setups())
def test_random_config_trains_or_is_refused_at_load(setup: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = dict(setup["config"])
        config.update(
            entity_path=str(root / "entities"),
            edge_paths=[str(root / "edges")],
            checkpoint_path=str(root / "model"),
        )
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        edges = root / "edges.tsv"
        write_edges(edges, setup)

        rc, err = run(["import", str(path), str(edges), "--no-progress"])
        if rc != 0:  # refused at load time: one line per problem, each naming config and key
            lines = err.strip().splitlines()
            assert rc == 2 and lines, err
            assert lines[0].startswith(f"bigembed import: error: {path}: "), err
            assert all(line.startswith(f"{path}: ") for line in lines[1:]), err
            assert not (root / "entities").exists() and not (root / "model").exists()
            event("refused: " + lines[0].split(": ", 3)[-1][:60])
            return
        event(f"trained, workers {config['workers']}")
        rc, err = run(["train", str(path), "--no-progress"])
        assert rc == 0, err
        stats = [json.loads(line) for line in (root / "model" / "training_stats.json").open()]
        assert all(np.isfinite(s["stats"]["loss"]) for s in stats if s.get("type") == "bucket")
        report = root / "report.json"
        rc, err = run(["eval", str(path), "--no-progress", "--output", str(report)])
        assert rc == 0, err
        data = json.loads(report.read_text())
        assert data["num_edges"] == 150
        raw = data["overall"]["raw"]
        assert raw["count"] == 300 and 0 < raw["mrr"] <= 1
