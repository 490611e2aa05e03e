"""pydantic's validation errors as one line per problem: ``FILE: key.path: message``.

No pydantic boilerplate (URLs, error types); unknown keys and names get a "did you mean".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from bigembed.config.fields import is_model, nesting, suggest


def _loc_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The schema class describing the mapping at ``loc`` (for 'did you mean' suggestions)."""
    current: Any = model
    i = 0
    while i < len(loc):
        if not is_model(current) or loc[i] not in current.model_fields:
            return None
        kind, inner = nesting(current.model_fields[loc[i]].annotation)
        if kind == "model":
            current, i = inner, i + 1
        elif kind in ("dict", "list"):
            current, i = inner, i + 2
        else:
            return None
    return current if is_model(current) else None


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NO_GOT = frozenset(
    {
        "missing",
        "extra_forbidden",
        "cross_field",
        "unsupported",
        "entity_name",
        "too_short",
        "string_too_short",
    }
)


def _describe(err: Any, model: type[BaseModel]) -> list[str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    msg = str(err["msg"])
    if kind == "cross_field":
        return msg.splitlines()
    if kind == "extra_forbidden":
        parent = loc[:-1]
        owner = _model_at(model, parent)
        options = list(owner.model_fields) if owner is not None else []
        where = f"{_loc_path(parent)}: " if parent else ""
        return [f"{where}unknown key {loc[-1]!r}{suggest(str(loc[-1]), options)}"]
    if kind == "missing":
        text = "required key is missing"
    elif kind in ("too_short", "string_too_short"):
        text = "must not be empty"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = "expected a mapping of keys to values"
    elif kind == "list_type":
        text = "expected a list"
    elif kind == "string_type":
        text = "expected a string"
    else:
        text = msg[:1].lower() + msg[1:]
    if kind not in _NO_GOT and "input" in err:
        text += f", got {_show(err['input'])}"
    if kind in ("literal_error", "choice") and isinstance(err.get("input"), str):
        options = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        text += suggest(err["input"].lower(), options)
    path = _loc_path(loc)
    return [f"{path}: {text}" if path else text]


def format_validation_error(exc: ValidationError, source: str, model: type[BaseModel]) -> str:
    """pydantic's errors as ``SOURCE: key.path: message`` lines, without pydantic boilerplate."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        for line in _describe(err, model):
            if line not in lines:
                lines.append(line)
    return "\n".join(f"{source}: {line}" for line in lines)
