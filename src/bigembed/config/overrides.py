"""``-p key.path=value`` overrides, applied to the raw config dict before validation.

A failure is a :class:`~bigembed.errors.ConfigError` naming the file, the override and the key.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any, Literal, get_origin

from pydantic import BaseModel

from bigembed.config.fields import is_model, nesting, parses_text, strip_annotation, suggest
from bigembed.config.keys import snake
from bigembed.errors import ConfigError

_NULLS = frozenset({"null", "none", "~"})
_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


def _convert(text: str, annotation: Any, fail: Any) -> Any:
    """Convert an override's text to the field's type; ``fail(msg)`` raises."""
    ann, nullable = strip_annotation(annotation)
    if nullable and text.strip().lower() in _NULLS:
        return None
    if parses_text(annotation):
        return text  # the field's own validator reads the text (e.g. a size with a unit)
    kind, inner = nesting(ann)
    if kind == "list" and not is_model(inner):
        return [_convert(part.strip(), inner, fail) for part in text.split(",") if part.strip()]
    if kind != "leaf":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            fail(
                "expected a JSON value for a whole section "
                "(or set its keys one by one, e.g. entities.all.num_partitions=4)"
            )
    if ann is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        fail(f"expected a boolean (true/false/yes/no/on/off/1/0), got {text!r}")
    if ann is int:
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
            fail(f"expected an integer, got {text!r}")
    if ann is float:
        try:
            return float(text)
        except ValueError:
            fail(f"expected a number, got {text!r}")
    if get_origin(ann) is Literal:
        return text.strip()
    return text


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], model: type[BaseModel], source: str
) -> dict[str, Any]:
    """Apply PBG-style ``key.path=value`` overrides to a copy of the raw config dict.

    Paths are dotted; list items are addressed by index (``relations.0.operator``), entity
    types by name (``entities.all.num_partitions``); list-typed values are split on commas
    (``edge_paths=a,b``); values are converted to the field's type (``null``/``none`` for
    None). A whole section may be given as JSON.
    """
    data = copy.deepcopy(data)
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.strip()

        def fail(msg: str, _override: str = override) -> None:
            raise ConfigError(f"{source}: -p {_override}: {msg}")

        if not sep or not key:
            fail("expected KEY=VALUE (e.g. -p num_epochs=10)")
        parts = key.split(".")
        container: Any = data
        current: type[BaseModel] = model
        path = ""
        i = 0
        while i < len(parts):
            name = snake(parts[i])
            fields = current.model_fields
            if name not in fields:
                where = f"{path}: " if path else ""
                fail(f"{where}unknown key {parts[i]!r}{suggest(name, list(fields))}")
            path = f"{path}.{name}" if path else name
            annotation = fields[name].annotation
            if i == len(parts) - 1:
                container[name] = _convert(value, annotation, lambda m, p=path: fail(f"{p}: {m}"))
                break
            kind, inner = nesting(annotation)
            if kind == "leaf":
                fail(f"{path} is a single value and has no sub-key {parts[i + 1]!r}")
            if kind == "model":
                sub = container.get(name)
                if not isinstance(sub, dict):
                    sub = container[name] = {}
                container, current, i = sub, inner, i + 1
                continue
            # dict or list: the next part selects an item
            items = container.get(name)
            sel = parts[i + 1]
            if kind == "dict":
                if not isinstance(items, dict):
                    items = container[name] = {}
                if sel not in items:
                    known = ", ".join(sorted(map(str, items))) or "none"
                    fail(f"{path}: no item {sel!r} (known: {known})")
                item_path = f"{path}.{sel}"
            else:
                if not isinstance(items, list):
                    fail(f"{path}: the config has no list here")
                try:
                    index = int(sel)
                except ValueError:
                    fail(f"{path}: expected a list index, got {sel!r}")
                if not -len(items) <= index < len(items):
                    fail(f"{path}: index {index} out of range (the list has {len(items)} items)")
                sel = index if index >= 0 else len(items) + index  # type: ignore[assignment]
                item_path = f"{path}[{sel}]"
            if i + 1 == len(parts) - 1:  # replace the whole item
                items[sel] = _convert(value, inner, lambda m, p=item_path: fail(f"{p}: {m}"))
                break
            if not is_model(inner):
                fail(f"{item_path} is a single value and has no sub-keys")
            if not isinstance(items[sel], dict):
                fail(f"{item_path}: the config has no mapping here")
            container, current, path, i = items[sel], inner, item_path, i + 2
    return data
