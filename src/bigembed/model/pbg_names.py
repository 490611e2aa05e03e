"""Parameter names: bigembed's ``ScoringModel`` state dict <-> PyTorch-BigGraph's checkpoint.

PBG stores each model parameter under a *public* name (``relations/{idx}/operator/{side}/
{param}``, ``entities/{type}/global_embedding``) with its internal state-dict key as an
attribute (``{side}_operators.{idx}.{param}``, ``global_embs.emb_{type}``). Its standard
operators name their parameters as bigembed's do (``translation``, ``diagonal``,
``linear_transformation``, ``real``, ``imag``); its dynamic (per-relation) operators use plurals
for the first three. This module is pure string mapping, importable without h5py.
"""

from __future__ import annotations

import re

_DYNAMIC_PLURALS = {
    "translation": "translations",
    "diagonal": "diagonals",
    "linear_transformation": "linear_transformations",
}
_SINGULARS = {v: k for k, v in _DYNAMIC_PLURALS.items()}

_OPERATOR_KEY = re.compile(r"^(?P<side>lhs|rhs)_operators\.(?P<idx>\d+)\.(?P<param>\w+)$")
_GLOBAL_KEY = re.compile(r"^global_embs\.(?P<type>.+)$")
_PUBLIC_OPERATOR = re.compile(r"^relations/(?P<idx>\d+)/operator/(?P<side>lhs|rhs)/(?P<param>\w+)$")
_PUBLIC_GLOBAL = re.compile(r"^entities/(?P<type>.+)/global_embedding$")


def pbg_param_name(param: str, dynamic: bool) -> str:
    """PBG's name of a bigembed operator parameter (plural for dynamic operators)."""
    return _DYNAMIC_PLURALS.get(param, param) if dynamic else param


def bigembed_param_name(param: str) -> str:
    """bigembed's name of a PBG operator parameter (standard or dynamic)."""
    return _SINGULARS.get(param, param)


def to_pbg(key: str, dynamic: bool) -> tuple[str, str]:
    """(public name, PBG state-dict key) of a bigembed state-dict key."""
    m = _OPERATOR_KEY.match(key)
    if m:
        param = pbg_param_name(m["param"], dynamic)
        return (
            f"relations/{m['idx']}/operator/{m['side']}/{param}",
            f"{m['side']}_operators.{m['idx']}.{param}",
        )
    m = _GLOBAL_KEY.match(key)
    if m:
        return f"entities/{m['type']}/global_embedding", f"global_embs.emb_{m['type']}"
    raise ValueError(f"no PBG name for model parameter {key!r}")


def from_pbg(public: str) -> str:
    """bigembed state-dict key of a PBG public parameter name."""
    m = _PUBLIC_OPERATOR.match(public)
    if m:
        return f"{m['side']}_operators.{m['idx']}.{bigembed_param_name(m['param'])}"
    m = _PUBLIC_GLOBAL.match(public)
    if m:
        return f"global_embs.{m['type']}"
    raise ValueError(f"unknown PBG model parameter {public!r}")
