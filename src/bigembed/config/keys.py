"""Config key names: PBG's ``mixedCase`` keys (``numEpochs``) read as ``snake_case``.

PBG converts mixedCase keys the same way; two keys that become one name (``numEpochs`` and
``num_epochs``) are an error naming the file, not a silent choice.
"""

from __future__ import annotations

import re
from typing import Any

from bigembed.errors import ConfigError


def snake(key: str) -> str:
    """``numEpochs`` -> ``num_epochs`` (PBG converts mixedCase keys the same way)."""
    if not any(c.isupper() for c in key):
        return key
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


def _snake_dict(data: dict[Any, Any], where: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    origin: dict[Any, Any] = {}
    for key, value in data.items():
        new = snake(key) if isinstance(key, str) else key
        if new in out:
            raise ValueError(f"{where}key {key!r} duplicates {origin[new]!r}")
        out[new] = value
        origin[new] = key
    return out


def snake_case_keys(data: dict[Any, Any]) -> dict[Any, Any]:
    """Convert the mixedCase keys of one mapping (used by the schema's before-validators)."""
    try:
        return _snake_dict(data, "")
    except ValueError:
        return data  # normalize_keys reports duplicates with the file name; leave as is here


def normalize_keys(data: dict[str, Any], source: str) -> dict[str, Any]:
    """snake_case the key names at every level that holds keys (not entity type names)."""
    try:
        out = _snake_dict(data, "")
        entities = out.get("entities")
        if isinstance(entities, dict):
            out["entities"] = {
                name: _snake_dict(v, f"entities.{name}: ") if isinstance(v, dict) else v
                for name, v in entities.items()
            }
        relations = out.get("relations")
        if isinstance(relations, list):
            out["relations"] = [
                _snake_dict(v, f"relations[{i}]: ") if isinstance(v, dict) else v
                for i, v in enumerate(relations)
            ]
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return out


def mixed_case_to_snake(data: Any) -> Any:
    """A schema's before-validator: PBG accepts ``mixedCase`` keys (``numEpochs``) and converts
    them to ``snake_case``."""
    if isinstance(data, dict):
        return snake_case_keys(data)
    return data
