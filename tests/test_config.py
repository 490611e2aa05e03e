"""Tests of the config schema, loaders, overrides, error messages and `bigembed config`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bigembed import cli
from bigembed.config import (
    ConfigSchema,
    EdgeFilesSchema,
    EntitySchema,
    GrowthSchema,
    RelationSchema,
    config_keys,
    config_to_dict,
    load_config,
    parse_config_dict,
)
from bigembed.datasets import fb15k237_demo_config
from bigembed.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def base() -> dict[str, Any]:
    """A small valid raw config (two entity types, three relations)."""
    return {
        "entities": {"user": {"num_partitions": 4}, "item": {"num_partitions": 4}},
        "relations": [
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
            {"name": "buys", "lhs": "user", "rhs": "item", "operator": "diagonal"},
            {"name": "likes", "lhs": "user", "rhs": "item"},
        ],
        "dimension": 64,
        "entity_path": "work/e",
        "edge_paths": ["work/train"],
        "checkpoint_path": "work/model",
        "lr": 0.05,
    }


def error_of(data: dict[str, Any], source: str = "cfg.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config_dict(data, source)
    return str(info.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def with_(**changes: Any) -> dict[str, Any]:
    data = base()
    data.update(changes)
    return data


# --------------------------------------------------------------------------- formats


def _toml(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if key in ("entities", "relations"):
            continue
        lines.append(f"{key} = {json.dumps(value)}")
    for name, ent in data["entities"].items():
        lines.append(f"[entities.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in ent.items()]
    for rel in data["relations"]:
        lines.append("[[relations]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in rel.items()]
    return "\n".join(lines) + "\n"


def test_every_format_loads_the_same(tmp_path: Path) -> None:
    data = base()
    paths = [
        write(tmp_path, "c.yaml", yaml.safe_dump(data)),
        write(tmp_path, "c.yml", yaml.safe_dump(data)),
        write(tmp_path, "c.json", json.dumps(data)),
        write(tmp_path, "c.toml", _toml(data)),
        write(tmp_path, "c.py", f"def get_torchbiggraph_config():\n    return {data!r}\n"),
    ]
    configs = [load_config(p) for p in paths]
    assert all(c == configs[0] for c in configs)
    assert configs[0].relations[1].operator == "diagonal"
    assert configs[0] == parse_config_dict(data)


def test_round_trip_through_dict() -> None:
    cfg = parse_config_dict(base())
    dumped = config_to_dict(cfg)
    assert json.loads(json.dumps(dumped)) == dumped
    assert parse_config_dict(dumped) == cfg
    assert dumped["comparator"] == "cos" and dumped["relations"][2]["operator"] == "none"


def test_examples_load() -> None:
    fb = load_config(EXAMPLES / "fb15k237.yaml")
    assert fb.dimension == 400 and fb.dynamic_relations and not fb.global_emb
    assert fb.relations[0].operator == "complex_diagonal" and fb.loss_fn == "softmax"
    assert fb.edge_paths == ["work/fb15k237/train"] and fb.num_uniform_negs == 1000
    assert fb.regularization_coef == pytest.approx(5e-2) and fb.workers == 2
    demo = load_config(fb15k237_demo_config())
    assert (demo.num_epochs, demo.dimension) == (5, 200)
    social = load_config(EXAMPLES / "social.toml")
    assert set(social.entities) == {"user", "item"}
    assert [r.operator for r in social.relations] == ["translation", "diagonal"]
    pbg = load_config(EXAMPLES / "fb15k_config.py")
    assert pbg.num_epochs == 50 and len(pbg.edge_paths) == 3


# --------------------------------------------------------------------------- defaults

PBG_DEFAULTS = {
    "init_scale": 1e-3,
    "max_norm": None,
    "global_emb": True,
    "comparator": "cos",
    "bias": False,
    "loss_fn": "ranking",
    "margin": 0.1,
    "regularization_coef": 0.0,
    "regularizer": "N3",
    "init_path": None,
    "checkpoint_preservation_interval": None,
    "num_epochs": 1,
    "num_edge_chunks": None,
    "max_edges_per_chunk": 1_000_000_000,
    "bucket_order": "inside_out",
    "workers": None,
    "batch_size": 1000,
    "num_batch_negs": 50,
    "num_uniform_negs": 50,
    "disable_lhs_negs": False,
    "disable_rhs_negs": False,
    "lr": 0.01,
    "relation_lr": None,
    "eval_fraction": 0.05,
    "eval_num_batch_negs": 1000,
    "eval_num_uniform_negs": 1000,
    "background_io": False,
    "verbose": 0,
    "hogwild_delay": 2.0,
    "dynamic_relations": False,
    "num_machines": 1,
    "num_partition_servers": -1,
    "distributed_init_method": None,
    "distributed_tree_init_order": True,
    "num_groups_for_partition_server": 16,
    "num_groups_per_sharded_partition_server": 1,
    "partition_shard_size": 250,
    "num_gpus": 0,
    "half_precision": False,
    # bigembed-only
    "seed": 0,
    "compute_dtype": "auto",
    "kernel": "auto",
    "distributed_mode": "partitioned",
    "distributed_timeout": 60.0,
    "uniform_negs_group": None,
    "train_type": "negative_sampling",
    "self_negative": "auto",
    "early_stopping": None,
    "tune": None,
    "memory_budget": None,
    "partition_prefetch": True,
    "load_balancing": "cost",
    "relation_init_scale": None,  # None: PBG's identity start of the operators
    "entity_dropout": 0.0,  # 0: no dropout, as PBG
    "relation_dropout": 0.0,
    "relation_prediction_weight": 0.0,  # 0: no relation-prediction objective
    "growth": GrowthSchema(),  # extended stores: random new rows, nothing frozen, every edge
    "edge_files": EdgeFilesSchema(),  # import reads column 0, 1, 2 of headerless files
}


def test_defaults_match_pbg() -> None:
    data = base()
    del data["lr"]
    cfg = parse_config_dict(data)
    for key, value in PBG_DEFAULTS.items():
        assert getattr(cfg, key) == value, key
    required = {
        "entities",
        "relations",
        "dimension",
        "entity_path",
        "edge_paths",
        "checkpoint_path",
    }
    assert set(ConfigSchema.model_fields) == set(PBG_DEFAULTS) | required | {"communication"}
    assert cfg.communication.precision == "fp32"
    assert set(EntitySchema.model_fields) == {"num_partitions", "featurized", "dimension"}
    assert set(RelationSchema.model_fields) == {
        "name",
        "lhs",
        "rhs",
        "weight",
        "operator",
        "all_negs",
    }
    rel = cfg.relations[2]
    assert (rel.weight, rel.operator, rel.all_negs) == (1.0, "none", False)
    assert cfg.entities["user"] == EntitySchema(num_partitions=4)
    assert all(field.description for field in ConfigSchema.model_fields.values())


def test_convenience_methods() -> None:
    data = base()
    data["entities"]["item"]["dimension"] = 64
    cfg = parse_config_dict(data)
    assert cfg.entity_dimension("user") == 64 and cfg.entity_dimension("item") == 64
    assert cfg.resolved_workers() == (os.cpu_count() or 1)
    assert cfg.resolved_relation_lr() == 0.05
    cfg2 = parse_config_dict(with_(workers=3, relation_lr=0.5))
    assert cfg2.resolved_workers() == 3 and cfg2.resolved_relation_lr() == 0.5


def test_frozen_and_extra_forbidden() -> None:
    cfg = parse_config_dict(base())
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error
        cfg.lr = 1.0  # type: ignore[misc]
    with pytest.raises(Exception):  # noqa: B017
        EntitySchema(num_partitions=1, bogus=1)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- parsing rules


def test_case_insensitive_enums_and_bool_strings() -> None:
    data = with_(
        comparator="DOT",
        loss_fn="Softmax",
        bucket_order="Outside_In",
        regularizer="n3",
        compute_dtype="BFloat16",
        bias="yes",
        global_emb="OFF",
        disable_lhs_negs="1",
        background_io=0,
    )
    data["relations"][0]["operator"] = "TRANSLATION"
    data["relations"][0]["all_negs"] = "On"
    cfg = parse_config_dict(data)
    assert (cfg.comparator, cfg.loss_fn, cfg.bucket_order) == ("dot", "softmax", "outside_in")
    assert (cfg.regularizer, cfg.compute_dtype) == ("N3", "bfloat16")
    assert cfg.bias is True and cfg.global_emb is False and cfg.disable_lhs_negs is True
    assert cfg.background_io is False
    assert cfg.relations[0].operator == "translation" and cfg.relations[0].all_negs is True


def test_mixed_case_keys() -> None:
    data = base()
    data["numEpochs"] = 7
    data["maxEdgesPerChunk"] = 10
    data["entities"]["user"] = {"numPartitions": 4}
    data["relations"][0]["allNegs"] = True
    cfg = parse_config_dict(data)
    assert cfg.num_epochs == 7 and cfg.max_edges_per_chunk == 10
    assert cfg.entities["user"].num_partitions == 4 and cfg.relations[0].all_negs
    data["num_epochs"] = 8
    assert "duplicates" in error_of(data)


def test_numbers() -> None:
    cfg = parse_config_dict(with_(lr=1, margin="1e-2", max_edges_per_chunk=1e6))
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.margin == 0.01 and cfg.max_edges_per_chunk == 1_000_000
    assert error_of(with_(num_epochs=1.5)) == (
        "cfg.yaml: num_epochs: input should be a whole number, got 1.5"
    )
    assert error_of(with_(lr="fast")) == "cfg.yaml: lr: input should be a valid number, got 'fast'"
    assert "batch_size: input should be an integer, not a boolean" in error_of(
        with_(batch_size=True)
    )
    assert "lr: input should be greater than or equal to 0, got -1" in error_of(with_(lr=-1))
    assert "global_emb: input should be a boolean" in error_of(with_(global_emb="maybe"))
    assert "verbose: input should be less than or equal to 1, got 2" in error_of(with_(verbose=2))


def test_unknown_keys_with_suggestion() -> None:
    assert error_of(with_(lrr=0.1)) == "cfg.yaml: unknown key 'lrr' (did you mean 'lr'?)"
    data = base()
    data["relations"][1]["opertor"] = "diagonal"
    assert "cfg.yaml: relations[1]: unknown key 'opertor' (did you mean 'operator'?)" in (
        error_of(data)
    )
    data = base()
    data["entities"]["user"]["num_partition"] = 2
    assert "entities.user: unknown key 'num_partition' (did you mean 'num_partitions'?)" in (
        error_of(data)
    )


def test_enum_error_and_missing_and_types() -> None:
    msg = error_of(with_(comparator="dott"))
    assert msg.startswith("cfg.yaml: comparator: input should be 'dot', 'cos'")
    assert "got 'dott' (did you mean 'dot'?)" in msg
    data = base()
    data["relations"][0]["operator"] = "rotate"
    assert "relations[0].operator: input should be 'none'" in error_of(data)
    data = base()
    del data["dimension"]
    assert error_of(data) == "cfg.yaml: dimension: required key is missing"
    assert "edge_paths: expected a list" in error_of(with_(edge_paths="work/train"))
    assert "edge_paths: must not be empty" in error_of(with_(edge_paths=[]))
    assert "entities: must not be empty" in error_of(with_(entities={}))
    assert "relations: must not be empty" in error_of(with_(relations=[]))
    assert "entities.user: expected a mapping" in error_of(
        with_(entities={"user": 3, "item": {"num_partitions": 4}})
    )
    msg = error_of(with_(lr="x", dimension=0))
    assert msg.splitlines() == [
        "cfg.yaml: dimension: input should be greater than 0, got 0",
        "cfg.yaml: lr: input should be a valid number, got 'x'",
    ]
    assert "pydantic" not in msg and "http" not in msg


# --------------------------------------------------------------------------- cross-field checks


def test_unknown_entity_type() -> None:
    data = base()
    data["relations"][2]["lhs"] = "usr"
    assert error_of(data) == (
        "cfg.yaml: relations[2].lhs: unknown entity type 'usr' (known: item, user)"
    )


def test_dynamic_relations_checks() -> None:
    msg = error_of(with_(dynamic_relations=True, global_emb=False))
    assert msg.startswith("cfg.yaml: relations: dynamic_relations: true needs exactly one")
    data = with_(dynamic_relations=True)
    data["relations"] = data["relations"][:1]
    assert "global_emb: global embeddings are not supported with dynamic_relations" in (
        error_of(data)
    )
    assert "set global_emb: false" in error_of(data)
    data["global_emb"] = False
    assert parse_config_dict(data).dynamic_relations


def test_both_negative_sides_disabled() -> None:
    msg = error_of(with_(disable_lhs_negs=True, disable_rhs_negs=True))
    assert "disable_rhs_negs: cannot be true together with disable_lhs_negs" in msg


def test_complex_diagonal_even_dimension() -> None:
    data = with_(dimension=63)
    data["relations"][0]["operator"] = "complex_diagonal"
    assert (
        "relations[0].operator: complex_diagonal needs an even dimension, but entity type "
        "'user' has 63 (dimension)" in error_of(data)
    )
    data = base()
    data["entities"]["item"]["dimension"] = 65
    data["entities"]["user"]["dimension"] = 65
    data["relations"][1]["operator"] = "complex_diagonal"
    msg = error_of(data)
    assert "relations[1].operator: complex_diagonal" in msg
    assert "(entities.item.dimension)" in msg and "(entities.user.dimension)" in msg


def test_lhs_rhs_dimension_must_match() -> None:
    data = base()
    data["entities"]["item"]["dimension"] = 32
    msg = error_of(data)
    assert (
        "relations[1]: lhs type 'user' has dimension 64 (dimension) but rhs type 'item' "
        "has dimension 32 (entities.item.dimension)" in msg
    )


def test_same_side_partitions() -> None:
    data = base()
    data["entities"]["item"]["num_partitions"] = 2
    msg = error_of(data)
    assert (
        "relations[1].rhs: entity type 'item' has 2 partitions but 'user' "
        "(relations[0].rhs) has 4" in msg
    )
    # unpartitioned types mix freely with partitioned ones
    data["entities"]["item"]["num_partitions"] = 1
    parse_config_dict(data)


def test_featurized_types_may_be_partitioned_and_distributed() -> None:
    data = base()  # 4 partitions per type
    data["entities"]["item"]["featurized"] = True
    assert parse_config_dict(data).entities["item"].featurized
    data["num_machines"] = 2
    data["distributed_init_method"] = "tcp://127.0.0.1:1"
    assert parse_config_dict(data).entities["item"].featurized
    data["growth"] = {"freeze": ["old_entities"]}  # old and new items share feature rows
    assert "growth.freeze: old_entities cannot hold with the featurized type 'item'" in error_of(
        data
    )
    data["growth"] = {"freeze": ["relations"]}
    parse_config_dict(data)


# --------------------------------------------------------------------------- PBG keys bigembed
# cannot honour: the default loads, anything else is a one-line error or a loud warning


@pytest.mark.parametrize(
    ("key", "bad", "default", "advice"),
    [
        ("num_gpus", 1, 0, "set num_gpus: 0"),
        ("numGpus", 2, 0, "set num_gpus: 0"),  # PBG's mixedCase spelling
        ("half_precision", True, False, "compute_dtype: bfloat16"),
    ],
)
def test_unsupported_gpu_keys_refused(key: str, bad: Any, default: Any, advice: str) -> None:
    parse_config_dict(with_(**{key: default}))
    msg = error_of(with_(**{key: bad}))
    assert len(msg.splitlines()) == 1
    snake = "num_gpus" if key == "numGpus" else key
    assert msg.startswith(f"cfg.yaml: {snake}: ")
    assert advice in msg and "CPU only" in msg


@pytest.mark.parametrize(
    ("key", "value", "default"),
    [
        ("num_groups_for_partition_server", 4, 16),
        ("num_groups_per_sharded_partition_server", 2, 1),
        ("partition_shard_size", 100, 250),
    ],
)
def test_ignored_partition_server_keys_warn(
    key: str, value: int, default: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        cfg = parse_config_dict(with_(**{key: default}), "w.yaml")
    assert caplog.text == ""  # the default value of a PBG config is silent
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        cfg = parse_config_dict(with_(**{key: value}), "w.yaml")
    assert getattr(cfg, key) == value  # still loads (the value is harmless)
    assert f"w.yaml: {key}: {value} is accepted for PBG compatibility and ignored" in caplog.text
    assert f"default {default}" in caplog.text


def test_ignored_distributed_only_keys_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        parse_config_dict(
            with_(num_machines=2, distributed_init_method="tcp://h:1", bucket_order="random"), "w"
        )
        parse_config_dict(with_(num_partition_servers=2), "w")
    assert "w: bucket_order: random is ignored with num_machines > 1" in caplog.text
    assert "w: num_partition_servers: ignored with num_machines: 1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        parse_config_dict(with_(bucket_order="random", num_partition_servers=-1), "w")
        parse_config_dict(with_(num_machines=2, distributed_init_method="tcp://h:1"), "w")
    assert caplog.text == ""


# Every key of PBG's ConfigSchema (reference/pbg.md section 1).
PBG_KEYS = {
    *(f"entities.TYPE.{k}" for k in ("num_partitions", "featurized", "dimension")),
    *(f"relations[i].{k}" for k in ("name", "lhs", "rhs", "weight", "operator", "all_negs")),
    *[
        "entities",
        "relations",
        "dimension",
        "init_scale",
        "max_norm",
        "global_emb",
        "comparator",
        "bias",
        "loss_fn",
        "margin",
        "regularization_coef",
        "regularizer",
        "entity_path",
        "edge_paths",
        "checkpoint_path",
        "init_path",
        "checkpoint_preservation_interval",
        "num_epochs",
        "num_edge_chunks",
        "max_edges_per_chunk",
        "bucket_order",
        "workers",
        "batch_size",
        "num_batch_negs",
        "num_uniform_negs",
        "disable_lhs_negs",
        "disable_rhs_negs",
        "lr",
        "relation_lr",
        "eval_fraction",
        "eval_num_batch_negs",
        "eval_num_uniform_negs",
        "background_io",
        "verbose",
        "hogwild_delay",
        "dynamic_relations",
        "num_machines",
        "num_partition_servers",
        "distributed_init_method",
        "distributed_tree_init_order",
        "num_groups_for_partition_server",
        "num_groups_per_sharded_partition_server",
        "partition_shard_size",
        "num_gpus",
        "half_precision",
    ],
}


def test_pbg_differences_table() -> None:
    from bigembed.config import IGNORED_KEYS, PBG_DIFFERENCES, pbg_status

    assert len(PBG_KEYS) == 54
    keys = {key for key, _, _, _ in config_keys()}
    assert keys >= PBG_KEYS
    assert set(PBG_DIFFERENCES) <= PBG_KEYS
    assert {k for k in keys if pbg_status(k) == "new"} == keys - PBG_KEYS
    # every key that is refused or ignored is marked, and says so in its description
    refused_or_ignored = {"num_gpus", "half_precision", *IGNORED_KEYS}
    assert refused_or_ignored <= set(PBG_DIFFERENCES)
    described = {key: text for key, _, _, text in config_keys()}
    for key in IGNORED_KEYS:
        assert "ignored" in described[key], key
    for key in ("num_gpus", "half_precision"):
        assert "must be" in described[key], key
    assert "entities.TYPE.featurized" in PBG_DIFFERENCES


@pytest.mark.parametrize("operator", ["linear", "affine"])
def test_n3_with_linear_operators(operator: str) -> None:
    data = with_(regularization_coef=1e-3)
    data["relations"][1]["operator"] = operator
    msg = error_of(data)
    assert (
        f"regularization_coef: the N3 regularizer does not support operator '{operator}' "
        "(relations[1].operator)" in msg
    )
    data["regularization_coef"] = 0
    parse_config_dict(data)


def test_other_checks() -> None:
    data = base()
    data["relations"][2]["name"] = "follows"
    assert "relations[2].name: duplicate relation name 'follows' (also relations[0])" in (
        error_of(data)
    )
    assert "distributed_init_method: required when num_machines > 1" in error_of(
        with_(num_machines=2)
    )
    parse_config_dict(with_(num_machines=2, distributed_init_method="tcp://h:1"))
    assert "entities: entity type name 'a/b'" in error_of(
        with_(entities={"a/b": {"num_partitions": 1}})
    )
    assert "eval_fraction: input should be less than 1" in error_of(with_(eval_fraction=1))


def test_all_problems_reported_together() -> None:
    data = with_(disable_lhs_negs=True, disable_rhs_negs=True, num_machines=2)
    assert len(error_of(data).splitlines()) == 2


def test_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        parse_config_dict(with_(background_io=True, loss_fn="logistic"), "w.yaml")
    text = caplog.text
    for key in ("background_io: deprecated", "loss_fn"):
        assert f"w.yaml: {key}" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bigembed.config"):
        parse_config_dict(base())
    assert caplog.text == ""


# --------------------------------------------------------------------------- overrides


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    return write(tmp_path, "c.yaml", yaml.safe_dump(base()))


def test_overrides(cfg_file: Path) -> None:
    cfg = load_config(
        cfg_file,
        [
            "num_epochs=5",
            "lr=0.5",
            "relations.0.operator=diagonal",
            "entities.user.num_partitions=2",
            "entities.item.num_partitions=2",
            "edge_paths=a,b",
            "global_emb=no",
            "max_norm=1",
            "relation_lr=null",
            "eval_num_batch_negs=none",
            "relations.2.all_negs=true",
            "entities.item.dimension=64",
            "numEpochs=6",
            "edge_paths.1=c",
            "relations.-1.weight=2",
        ],
    )
    assert cfg.num_epochs == 6 and cfg.lr == 0.5 and cfg.relations[0].operator == "diagonal"
    assert cfg.entities["user"].num_partitions == 2 and cfg.edge_paths == ["a", "c"]
    assert cfg.global_emb is False and cfg.max_norm == 1.0 and cfg.relation_lr is None
    assert cfg.eval_num_batch_negs is None and cfg.relations[2].all_negs
    assert cfg.relations[2].weight == 2.0
    cfg = load_config(cfg_file, ['relations.1={"name": "x", "lhs": "user", "rhs": "user"}'])
    assert cfg.relations[1].name == "x" and cfg.relations[1].operator == "none"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("lrr=1", "-p lrr=1: unknown key 'lrr' (did you mean 'lr'?)"),
        (
            "relations.7.operator=none",
            "-p relations.7.operator=none: relations: index 7 out of range (the list has 3 items)",
        ),
        ("relations.x.operator=none", "relations: expected a list index, got 'x'"),
        ("relations.0.opp=none", "relations[0]: unknown key 'opp'"),
        ("entities.usr.num_partitions=2", "entities: no item 'usr' (known: item, user)"),
        ("lr.x=1", "lr is a single value and has no sub-key 'x'"),
        ("num_epochs=1.5", "-p num_epochs=1.5: num_epochs: expected an integer, got '1.5'"),
        ("lr=fast", "lr: expected a number, got 'fast'"),
        ("bias=maybe", "bias: expected a boolean"),
        ("lr", "-p lr: expected KEY=VALUE"),
        ("relations.0=nojson", "relations[0]: expected a JSON value"),
    ],
)
def test_bad_overrides(cfg_file: Path, override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file, [override])
    assert str(info.value).startswith(f"{cfg_file}: ")
    assert expected in str(info.value)


def test_override_value_validated_with_path(cfg_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"relations\[0\]\.operator: input should be"):
        load_config(cfg_file, ["relations.0.operator=rotate"])


# --------------------------------------------------------------------------- file errors


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "a: [1, 2\nb: 3\n", "YAML syntax error"),
        ("dup.yaml", "lr: 1\nlr: 2\n", ":2: YAML syntax error: duplicate key 'lr'"),
        ("bad.toml", "lr = 0.1\ndimension = \n", ":2: TOML syntax error"),
        ("bad.json", '{"lr": 0.1,\n "x": }', ":2: JSON syntax error"),
        ("list.yaml", "- 1\n- 2\n", "must be a mapping of keys to values, got list"),
        ("empty.yaml", "", "the config is empty"),
        ("c.txt", "lr: 1", "unsupported config format '.txt'"),
        ("nofunc.py", "x = 1\n", "must define get_torchbiggraph_config()"),
        ("syntax.py", "def get_torchbiggraph_config(:\n", ":1: Python syntax error"),
        (
            "raises.py",
            "def get_torchbiggraph_config():\n    return 1 / 0\n",
            ":2: get_torchbiggraph_config() failed: ZeroDivisionError",
        ),
        ("notdict.py", "def get_torchbiggraph_config():\n    return [1]\n", "got list"),
    ],
)
def test_file_errors(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path / "d.yaml")


def test_python_config_runs_in_place(tmp_path: Path) -> None:
    helper = "import pathlib\nHERE = pathlib.Path(__file__).parent\n"
    body = (
        "def get_torchbiggraph_config():\n    d = "
        + repr(base())
        + "\n    d['entity_path'] = str(HERE / 'e')\n    return d\n"
    )
    path = write(tmp_path, "pbg.py", helper + body)
    assert load_config(path).entity_path == str(tmp_path / "e")
    assert "pbg" not in sys.modules


# --------------------------------------------------------------------------- CLI


def test_cli_show(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "show", str(cfg_file), "-p", "num_epochs=3"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["num_epochs"] == 3 and out["comparator"] == "cos" and out["seed"] == 0
    assert cli.main(["config", "show", str(cfg_file), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert parse_config_dict(data) == load_config(cfg_file)


def test_cli_keys(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["config", "keys"]) == 0
    out = capsys.readouterr().out
    for key, _, _, _ in config_keys():
        assert key in out
    assert "relations[i].operator" in out and "inside_out" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "  differs  " in rows["num_gpus"] and "  differs  " in rows["partition_shard_size"]
    assert "  same  " in rows["margin"] and "  new  " in rows["compute_dtype"]
    assert "  half_precision: true is refused (use compute_dtype: bfloat16)" in out


@pytest.mark.integration
def test_cli_bad_config_subprocess(tmp_path: Path) -> None:
    data = base()
    data["relations"][2]["lhs"] = "usr"
    path = write(tmp_path, "bad.yaml", yaml.safe_dump(data))
    proc = subprocess.run(
        [sys.executable, "-m", "bigembed.cli", "config", "show", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "relations[2].lhs: unknown entity type 'usr' (known: item, user)" in lines[0]
