"""The registries: every name resolves to an implementation of its kind, names are unique, and
an unknown name is refused in one line listing the known ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bigembed.cli import COMMANDS, build_parser
from bigembed.communication.codecs import Codec
from bigembed.communication.strategies import Strategy
from bigembed.config import PRECISIONS, STRATEGIES
from bigembed.model.comparators import Comparator
from bigembed.model.names import COMPARATORS, COMPUTE_DTYPES, LOSSES, OPERATORS
from bigembed.model.operators import Operator
from bigembed.registry import Registry, UnknownName

#: Each registry and what each of its names must resolve to.
KINDS = {
    "operator": (OPERATORS, lambda x: issubclass(x, Operator)),
    "comparator": (COMPARATORS, lambda x: issubclass(x, Comparator)),
    "loss": (LOSSES, lambda x: callable(x(0.1))),
    "compute dtype": (COMPUTE_DTYPES, lambda x: isinstance(x, torch.dtype)),
    "precision": (PRECISIONS, lambda x: issubclass(x, Codec)),
    "communication strategy": (STRATEGIES, lambda x: issubclass(x, Strategy)),
    "command": (COMMANDS, callable),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_registered_name_resolves_to_its_kind(kind: str) -> None:
    registry, is_kind = KINDS[kind]
    assert registry.kind == kind and len(registry) > 0
    for name in registry.names:
        assert is_kind(registry.get(name)), (kind, name, registry.target(name))


@pytest.mark.parametrize("registry", [PRECISIONS, STRATEGIES])
def test_implementations_know_their_name_from_the_registry(registry: Registry[type]) -> None:
    for name in registry:
        assert registry.name_of(registry.get(name)) == name
    with pytest.raises(UnknownName, match="is not a registered"):
        registry.name_of(Codec)


def test_a_name_registered_twice_or_without_a_target_is_refused() -> None:
    with pytest.raises(ValueError, match="operator 'a' is registered twice"):
        Registry("operator", [("a", "m:x"), ("b", "m:y"), ("a", "m:z")])
    with pytest.raises(ValueError, match=r"'m\.x' is not 'module:attribute'"):
        Registry("operator", [("a", "m.x")])


def test_unknown_name_is_one_line_listing_the_known_ones() -> None:
    with pytest.raises(UnknownName) as err:
        COMPARATORS.get("dott")
    assert str(err.value) == "unknown comparator 'dott' (known: dot, cos, l2, squared_l2)"
    assert isinstance(err.value, ValueError)


def test_help_lists_every_command_in_registry_order() -> None:
    listed = [a.dest for a in build_parser()._subparsers._group_actions[0]._choices_actions]  # type: ignore[union-attr]
    assert [c for c in listed if c in COMMANDS] == list(COMMANDS.names)
    assert listed == [
        "demo", "datasets", "init", "split", "import", "config", "train", "tune", "eval", "export",
        "predict", "similar", "index", "convert", "remap", "plot", "launch", "partition-server",
        "build-kernels",
    ]  # fmt: skip


@pytest.mark.integration
def test_the_names_load_no_implementation() -> None:
    """The registries give their names without importing torch (``bigembed config`` stays
    fast); only asking for an implementation imports its module."""
    code = (
        "import sys\n"
        "from bigembed.model.names import OPERATOR_NAMES\n"
        "from bigembed.config.types import STRATEGY_NAMES, PRECISION_NAMES\n"
        "import bigembed.cli\n"
        "import bigembed.config\n"
        "assert OPERATOR_NAMES and STRATEGY_NAMES and PRECISION_NAMES\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_operator_has_a_cost() -> None:
    """The cost models (training's load balance, distributed eval's split) price every
    registered operator."""
    from bigembed.model import OPERATOR_MADDS, OPERATORS

    assert set(OPERATOR_MADDS) == set(OPERATORS.names)
