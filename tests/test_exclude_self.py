"""``bigembed eval --exclude-self`` and ``predict --exclude-self``: on a relation within one
entity type (follows, knows) the query's own entity is never a candidate answer. The eval
must give exactly what the documented workaround gave: a filter file of self-pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigembed.cli import main as cli_main
from bigembed.config import load_config
from bigembed.eval import evaluate_checkpoint
from bigembed.serving import QueryError, load
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


def test_predict_leaves_the_entity_itself_out_by_default(project: Path, capsys) -> None:
    model = load(project / "out" / "model")
    every = model.predict("e3", "follows", k=N, include_self=True)
    assert "e3" in [p.name for p in every] and len(every) == N
    assert model.predict("e3", "follows", k=N, exclude_self=False) == every  # the old spelling
    for side in ("rhs", "lhs"):
        for filtered in (False, True):
            got = model.predict("e3", "follows", k=N, side=side, filtered=filtered)
            names = [p.name for p in got]
            assert "e3" not in names and len(set(names)) == len(names)
            assert got == model.predict(  # exclude_self=True: the default, still accepted
                "e3", "follows", k=N, side=side, filtered=filtered, exclude_self=True
            )
    assert len(model.predict("e3", "follows", k=N)) == N - 1  # no -inf "answer" at the end
    many = model.predict(["e3", "e7"], "follows", k=N)
    assert all(q not in [p.name for p in ps] for q, ps in zip(["e3", "e7"], many, strict=True))
    with pytest.raises(QueryError, match="contradict"):
        model.predict("e3", "follows", include_self=True, exclude_self=True)
    argv = ["predict", str(project / "out" / "model"), "--lhs", "e3", "--rel", "follows"]
    for extra, listed in (([], False), (["--exclude-self"], False), (["--include-self"], True)):
        assert cli_main([*argv, "-k", str(N), "--json", *extra]) == 0
        assert ('"e3"' in capsys.readouterr().out) is listed, extra
    with pytest.raises(SystemExit) as info:  # argparse: one of the two
        cli_main([*argv, "--include-self", "--exclude-self"])
    assert info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_relations_across_types_keep_every_answer(tmp_path: Path) -> None:
    """Leaving the query out applies only within one type: a person is never a city, and a
    city named like a person is a different entity that stays a candidate."""
    write_config(
        tmp_path,
        entities={"person": 1, "city": 1},
        relations=[("lives_in", "person", "city")],
    )
    rows = [(f"x{i}", "lives_in", f"x{(i * 7) % 12}") for i in range(12)] * 20
    write_tsv(tmp_path / "train.tsv", rows)
    config = str(tmp_path / "config.yaml")
    assert cli_main(["import", "--no-progress", config, str(tmp_path / "train.tsv")]) == 0
    args = ["-p", "num_epochs=1", "-p", "dimension=4", "-p", "workers=1"]
    assert cli_main(["train", "--no-progress", config, *args]) == 0
    model = load(tmp_path / "out" / "model")
    cities = model.num_entities("city")
    got = model.predict("x3", "lives_in", k=cities)
    assert "x3" in [p.name for p in got] and len(got) == cities
