"""``bigembed eval --exclude-self`` and ``predict --exclude-self``: on a relation within one
entity type (follows, knows) the query's own entity is never a candidate answer. The eval
must give exactly what the documented workaround gave: a filter file of self-pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigembed.cli import main as cli_main
from bigembed.config import load_config
from bigembed.eval import evaluate_checkpoint
from bigembed.serving import load
from support.imports import random_edges, write_config, write_tsv

N = 30


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("self")
    write_config(root, entities={"node": 1}, relations=[("follows", "node", "node")])
    edges = random_edges(900, N, ["follows"], seed=4)
    write_tsv(root / "train.tsv", edges[:800])
    write_tsv(root / "test.tsv", edges[800:])
    config = str(root / "config.yaml")
    assert cli_main(["import", "--no-progress", config, str(root / "train.tsv")]) == 0
    args = ["train", "--no-progress", config, "-p", "num_epochs=3", "-p", "dimension=4"]
    assert cli_main(args) == 0
    return root


def test_eval_excludes_the_query_entity_as_the_self_pairs_filter_did(project: Path) -> None:
    cfg = load_config(project / "config.yaml")
    test = [str(project / "test.tsv")]
    rows = [line.split("\t") for line in (project / "test.tsv").read_text().splitlines()]
    pairs = [(h, r, h) for h, r, _ in rows] + [(t, r, t) for _, r, t in rows]
    write_tsv(project / "self_pairs.tsv", pairs)
    workaround = evaluate_checkpoint(cfg, test, [*cfg.edge_paths, str(project / "self_pairs.tsv")])
    excluded = evaluate_checkpoint(cfg, test, exclude_self=True)
    plain = evaluate_checkpoint(cfg, test)
    assert excluded.sides == workaround.sides  # both sides, raw and filtered, every metric
    assert excluded.overall == workaround.overall
    assert excluded.overall["raw"] == plain.overall["raw"], "raw ranks are not filtered"
    assert excluded.overall["filtered"] != plain.overall["filtered"]
    assert excluded.overall["filtered"]["mrr"] > plain.overall["filtered"]["mrr"]
    assert any("--exclude-self" in note for note in excluded.notes)


def test_exclude_self_needs_the_filtered_ranking(project: Path, capsys) -> None:
    config = str(project / "config.yaml")
    for extra in (["--raw-only"], ["--protocol", "sampled"]):
        assert cli_main(["eval", "--no-progress", config, "--exclude-self", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--exclude-self" in err[0], err


def test_predict_never_answers_the_entity_itself(project: Path, capsys) -> None:
    model = load(project / "out" / "model")
    every = model.predict("e3", "follows", k=N)
    assert "e3" in [p.name for p in every]
    for side in ("rhs", "lhs"):
        for filtered in (False, True):
            got = model.predict(
                "e3", "follows", k=N, side=side, filtered=filtered, exclude_self=True
            )
            names = [p.name for p in got if p.score != float("-inf")]
            assert "e3" not in names and len(set(names)) == len(names)
    many = model.predict(["e3", "e7"], "follows", k=N, exclude_self=True)
    assert all(q not in [p.name for p in ps] for q, ps in zip(["e3", "e7"], many, strict=True))
    argv = ["predict", str(project / "out" / "model"), "--lhs", "e3", "--rel", "follows"]
    assert cli_main([*argv, "-k", str(N), "--exclude-self", "--json"]) == 0
    assert '"e3"' not in capsys.readouterr().out
