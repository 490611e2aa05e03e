"""The model is built from a ModelSpec; the config's allowed names are the model's registries."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import pytest
import torch

from bigembed.config import config_keys, model_spec, parse_config_dict
from bigembed.errors import ConfigError
from bigembed.model import NegativeSettings, ScoringModel, SideEmbeddings
from bigembed.model.losses import ranking_loss
from bigembed.model.names import (
    COMPARATOR_NAMES,
    COMPUTE_DTYPE_SETTINGS,
    LOSS_NAMES,
    OPERATOR_NAMES,
)
from bigembed.model.spec import ModelSpec, RelationSpec


def raw(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 1, "dimension": 6}},
        "relations": [
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
            {"name": "buys", "lhs": "item", "rhs": "item", "operator": "diagonal", "weight": 2},
            {"name": "likes", "lhs": "user", "rhs": "user", "all_negs": True},
        ],
        "dimension": 4,
        "entity_path": "e",
        "edge_paths": ["t"],
        "checkpoint_path": "m",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("relations.operator", OPERATOR_NAMES),
        ("comparator", COMPARATOR_NAMES),
        ("loss_fn", LOSS_NAMES),
        ("compute_dtype", COMPUTE_DTYPE_SETTINGS),
    ],
)
def test_config_allows_exactly_the_registry_names(key: str, names: tuple[str, ...]) -> None:
    def with_value(value: Any) -> dict[str, Any]:
        if key == "relations.operator":
            data = raw(global_emb=False)
            data["relations"][0]["operator"] = value
            return data
        return raw(**{key: value})

    def value_of(data: dict[str, Any]) -> Any:
        cfg = parse_config_dict(data)
        return cfg.relations[0].operator if key == "relations.operator" else getattr(cfg, key)

    for name in names:
        assert value_of(with_value(name)) == name
        assert value_of(with_value(f" {name.upper()} ")) == name  # case-insensitive, as PBG
    with pytest.raises(ConfigError) as info:
        parse_config_dict(with_value("nope"), "c.yaml")
    listed = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
    assert f"input should be {listed}, got 'nope'" in str(info.value)
    shown = {k: t for k, t, _, _ in config_keys()}
    assert shown[key.replace("relations.", "relations[i].")] == "|".join(names)


def test_model_spec_of_config() -> None:
    cfg = parse_config_dict(
        raw(
            comparator="dot",
            bias=True,
            loss_fn="softmax",
            margin=0.5,
            max_norm=2.0,
            regularization_coef=0.01,
            compute_dtype="bfloat16",
        )
    )
    spec = model_spec(cfg, 7)  # the count is ignored: the relations are the config's
    assert spec == ModelSpec(
        relations=(
            RelationSpec("user", "user", "translation", 1.0, False),
            RelationSpec("item", "item", "diagonal", 2.0, False),
            RelationSpec("user", "user", "none", 1.0, True),
        ),
        entity_dims={"user": 4, "item": 6},
        comparator="dot",
        bias=True,
        loss="softmax",
        margin=0.5,
        global_emb=True,
        dynamic_relations=False,
        num_dynamic_relations=0,
        max_norm=2.0,
        regularization_coef=0.01,
        compute_dtype="bfloat16",
    )
    assert spec.num_relations == 3 and spec.relation(2).all_negs
    model = ScoringModel(spec)
    assert not hasattr(model, "config")
    assert model.compute_dtype == torch.bfloat16
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "rhs_operators.0.translation": (4,),
        "rhs_operators.1.diagonal": (6,),
        "global_embs.user": (4,),
        "global_embs.item": (6,),
    }

    dyn = model_spec(
        parse_config_dict(
            raw(relations=[raw()["relations"][1]], dynamic_relations=True, global_emb=False)
        ),
        5,
    )
    assert dyn.dynamic_relations and dyn.num_relations == 5 and dyn.relation(4).lhs == "item"
    dyn_shapes = {k: tuple(v.shape) for k, v in ScoringModel(dyn).state_dict().items()}
    assert dyn_shapes == {"lhs_operators.0.diagonal": (5, 6), "rhs_operators.0.diagonal": (5, 6)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"comparator": "dott"}, "unknown comparator 'dott' (known: dot, cos, l2, squared_l2)"),
        ({"loss": "hinge"}, "unknown loss 'hinge' (known: ranking, logistic, softmax)"),
        ({"compute_dtype": "fp16"}, "unknown compute dtype 'fp16' (known: float32, bfloat16)"),
        (
            {"relations": (RelationSpec("a", "a", "rotate"),)},
            "unknown operator 'rotate' (known: none, translation, diagonal, linear, affine, "
            "complex_diagonal)",
        ),
    ],
)
def test_unknown_names_fail_when_the_model_is_built(change: dict[str, Any], message: str) -> None:
    spec: dict[str, Any] = {"relations": (RelationSpec("a", "a"),), "entity_dims": {"a": 4}}
    spec.update(change)
    with pytest.raises(ValueError) as info:
        ScoringModel(ModelSpec(**spec))
    assert str(info.value) == message


def test_model_pickles_with_its_spec() -> None:
    """Hogwild workers receive the model by pickle: spec and loss must survive it."""
    spec = ModelSpec(
        relations=(RelationSpec("a", "a", "diagonal"),), entity_dims={"a": 4}, margin=0.3
    )
    torch.manual_seed(0)
    model = ScoringModel(spec)
    copy = pickle.loads(pickle.dumps(model))
    assert copy.spec == spec
    negs = NegativeSettings(num_batch_negs=3, num_uniform_negs=0, uniform_group=6)
    lhs, rhs = torch.randn(6, 4), torch.randn(6, 4)
    rel = torch.zeros(6, dtype=torch.long)

    def loss(m: ScoringModel) -> torch.Tensor:
        sides = SideEmbeddings(lhs, torch.arange(6)), SideEmbeddings(rhs, torch.arange(6))
        return m(*sides, rel, 0, None, negs).loss

    with torch.no_grad():
        assert torch.equal(loss(copy), loss(model)) and float(loss(model)) > 0
        out = model(
            SideEmbeddings(lhs, torch.arange(6)),
            SideEmbeddings(rhs, torch.arange(6)),
            rel,
            0,
            None,
            negs,
        )
        want = ranking_loss(out.lhs_pos, out.lhs_neg, None, 0.3) + ranking_loss(
            out.rhs_pos, out.rhs_neg, None, 0.3
        )
        assert torch.allclose(out.loss, want)  # the spec's loss, with the spec's margin


@pytest.mark.integration
def test_loading_a_config_does_not_import_torch() -> None:
    """The registries and ModelSpec are torch-free: `bigembed import`/`config` stay fast."""
    code = (
        "import sys\n"
        "from bigembed.config import format_config_keys, model_spec, parse_config_dict\n"
        f"cfg = parse_config_dict({raw()!r})\n"
        "model_spec(cfg)\n"
        "format_config_keys()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
