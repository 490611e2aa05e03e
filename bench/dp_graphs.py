"""The graphs of bench/dp_bench.py: each a config, imported train and test edges, and a filter.

* ``fb15k237``: FB15k-237 (bundled with bigembed), 1 partition, ComplEx (``complex_diagonal``,
  dynamic relations) as examples/fb15k237.yaml but at the bench's dimension and negatives;
* ``slashdot``: the soc-Slashdot0902-like power-law graph of bench/sparse_bench.py (one
  relation, ``diagonal``), 1 or 4 partitions, a few thousand edges withheld as the test set;
* ``skewed``: :func:`skewed_edges`, two relations of very different cost per edge.

Every graph is written as TSV files of names and imported with ``bigembed import``, as a user
would; the test edges are ranked by ``bigembed eval`` (filtered, against every entity).
"""

from __future__ import annotations

import gzip
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rank_runs import CLI, ROOT, bench_env
from sparse_bench import edge_lines, slashdot_edges

FB15K237 = ROOT / "src" / "bigembed" / "datasets" / "fb15k237"


@dataclass
class Graph:
    """An imported graph: ``config`` trains on ``train``; ``test`` is ranked, filtered by
    ``filters``."""

    name: str
    partitions: int
    config: Path
    train: Path
    test: Path
    filters: list[Path] = field(default_factory=list)
    note: str = ""


# ------------------------------------------------------------------ the skewed graph (pure)
def skewed_edges(
    nodes: int, edges: int, linear_share: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(heads, relation ids, tails): ``edges`` learnable edges over ``nodes`` nodes, a share
    ``linear_share`` of them of relation 0 (``linear``: d² per edge) and the rest of relation 1
    (``diagonal``: d per edge), in random order. Each relation has its own planted map
    (tail = head · a_r + small noise, mod nodes), so the operators have something to learn."""
    rng = np.random.default_rng(seed)
    rels = (rng.random(edges) >= linear_share).astype(np.int64)  # 0: linear, 1: diagonal
    heads = rng.integers(0, nodes, edges)
    tails = (heads * np.where(rels == 0, 7, 3) + rng.integers(0, 3, edges)) % nodes
    return heads, rels, tails


def cost_share(linear_share: float, per_edge: tuple[float, float]) -> float:
    """The share of an epoch's cost in the linear relation, given (linear, diagonal) costs per
    edge."""
    lin = linear_share * per_edge[0]
    return lin / (lin + (1 - linear_share) * per_edge[1])


SKEWED_RELATIONS = ("lin", "diag")
SKEWED_MODEL: dict[str, Any] = {
    "entities": {"node": {"num_partitions": 1}},
    "relations": [
        {"name": "lin", "lhs": "node", "rhs": "node", "operator": "linear"},
        {"name": "diag", "lhs": "node", "rhs": "node", "operator": "diagonal"},
    ],
    "dynamic_relations": False,
}


def skewed_settings(common: dict[str, Any], dimension: int) -> dict[str, Any]:
    """The skewed graph's training settings: ``common`` with a large dimension and few
    negatives, so that the linear operator (d² per edge) dominates an edge's cost."""
    return {**common, "dimension": dimension, "num_batch_negs": 5, "num_uniform_negs": 5}


def _skewed_lines(heads: np.ndarray, rels: np.ndarray, tails: np.ndarray) -> str:
    names = np.array(SKEWED_RELATIONS)[rels]
    cols = [np.char.add("n", heads.astype(str)), names, np.char.add("n", tails.astype(str))]
    return "\n".join("\t".join(t) for t in zip(*cols, strict=True)) + "\n"


# ------------------------------------------------------------------ importing
def _import(
    config: Path, work: Path, files: list[Path], names: list[str], extra: list[str]
) -> list[Path]:
    paths = [work / n for n in names]
    if not (work / "entities" / "manifest.json").exists():
        cmd = [*CLI, "import", str(config), "-p", "edge_paths=" + ",".join(map(str, paths))]
        cmd += [*extra, *map(str, files), "--no-progress", "--force"]
        subprocess.run(cmd, check=True, cwd=ROOT, env=bench_env(), stdout=subprocess.DEVNULL)
    return paths


def _write_config(work: Path, model: dict[str, Any], settings: dict[str, Any]) -> Path:
    config = {
        **model,
        "entity_path": str(work / "entities"),
        "edge_paths": [str(work / "train")],
        "checkpoint_path": str(work / "model"),
        "global_emb": False,
        "comparator": "dot",
        "loss_fn": "softmax",
        "eval_fraction": 0,
        "workers": 1,
        "hogwild_delay": 0,  # no head start for the first worker: epoch times compare as they are
        **settings,
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fb15k237(root: Path, settings: dict[str, Any], max_train: int = 0) -> Graph:
    """FB15k-237; ``max_train`` > 0: only its first edges (test: a tenth as many)."""
    work = root / (f"fb15k237_{max_train}" if max_train else "fb15k237")
    work.mkdir(parents=True, exist_ok=True)
    files = []
    for split in ("train", "valid", "test"):
        src = FB15K237 / f"{split}.txt.gz"
        if max_train:
            keep = max_train if split == "train" else max(1, max_train // 10)
            dst = work / f"{split}.txt"
            if not dst.exists():
                with gzip.open(src, "rt") as f:
                    dst.write_text("".join(line for _, line in zip(range(keep), f, strict=False)))
            src = dst
        files.append(src)
    model = {
        "entities": {"all": {"num_partitions": 1}},
        "relations": [
            {"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}
        ],
        "dynamic_relations": True,
    }
    config = _write_config(work, model, settings)
    train, valid, test = _import(config, work, files, ["train", "valid", "test"], [])
    return Graph("fb15k237", 1, config, train, test, [train, valid, test])


def slashdot(
    root: Path, settings: dict[str, Any], partitions: int, nodes: int, edges: int, tests: int
) -> Graph:
    """The Slashdot-like graph (``nodes``, ``edges``), ``tests`` of its edges withheld."""
    work = root / f"slashdot_{nodes}_{edges}_p{partitions}"
    work.mkdir(parents=True, exist_ok=True)
    train_tsv, test_tsv = work / "train.tsv", work / "test.tsv"
    if not test_tsv.exists():
        src, dst = slashdot_edges(nodes, edges, seed=0)
        train_tsv.write_text(edge_lines(src[tests:], dst[tests:]))
        test_tsv.write_text(edge_lines(src[:tests], dst[:tests]))
    model = {
        "entities": {"user": {"num_partitions": partitions}},
        "relations": [{"name": "link", "lhs": "user", "rhs": "user", "operator": "diagonal"}],
    }
    config = _write_config(work, model, settings)
    extra = ["--rel-col", "none", "-r", "1"]
    train, test = _import(config, work, [train_tsv, test_tsv], ["train", "test"], extra)
    note = f"slashdot = {nodes:,} nodes, {edges - tests:,} training edges"
    return Graph("slashdot", partitions, config, train, test, [train, test], note)


def skewed(
    root: Path,
    settings: dict[str, Any],
    nodes: int,
    edges: int,
    linear_share: float,
    tests: int,
) -> Graph:
    """The cost-skewed graph of :func:`skewed_edges`, 1 partition, ``tests`` edges withheld."""
    work = root / f"skewed_{nodes}_{edges}_{linear_share}"
    work.mkdir(parents=True, exist_ok=True)
    train_tsv, test_tsv = work / "train.tsv", work / "test.tsv"
    if not test_tsv.exists():
        h, r, t = skewed_edges(nodes, edges, linear_share, seed=0)
        train_tsv.write_text(_skewed_lines(h[tests:], r[tests:], t[tests:]))
        test_tsv.write_text(_skewed_lines(h[:tests], r[:tests], t[:tests]))
    config = _write_config(work, SKEWED_MODEL, settings)
    train, test = _import(config, work, [train_tsv, test_tsv], ["train", "test"], [])
    note = (
        f"skewed = {nodes:,} nodes, {edges - tests:,} training edges, {linear_share:.0%} of them "
        "`linear`, the rest `diagonal`"
    )
    return Graph("skewed", 1, config, train, test, [train, test], note)


def filtered_mrr(graph: Graph, ckpt: Path, report: Path) -> float:
    """``bigembed eval``'s filtered MRR of ``graph``'s test edges on checkpoint ``ckpt``."""
    cmd = [*CLI, "eval", str(graph.config), "-p", f"checkpoint_path={ckpt}"]
    cmd += ["--edges", str(graph.test), "--filter-edges", *map(str, graph.filters)]
    cmd += ["--output", str(report), "--force", "--no-progress"]
    subprocess.run(cmd, check=True, cwd=ROOT, env=bench_env(), stdout=subprocess.DEVNULL)
    return float(json.loads(report.read_text())["overall"]["filtered"]["mrr"])
