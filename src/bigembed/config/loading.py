"""Reading config files, applying ``-p`` overrides, and turning validation errors into text.

Kept apart from :mod:`bigembed.config` (the schema) so that each stays small. Nothing here
imports the schema: the functions that need it take the model class as an argument.

Every failure is a :class:`~bigembed.errors.ConfigError` whose message starts with the file
name (``FILE:`` or ``FILE:LINE:``), then the key path, then what is wrong.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import re
import runpy
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from bigembed.config.types import PARSES_TEXT, OneOf
from bigembed.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FORMATS = (".yaml", ".yml", ".toml", ".json", ".py")

# --------------------------------------------------------------------------- keys


def _snake(key: str) -> str:
    """``numEpochs`` -> ``num_epochs`` (PBG converts mixedCase keys the same way)."""
    if not any(c.isupper() for c in key):
        return key
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


def _snake_dict(data: dict[Any, Any], where: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    origin: dict[Any, Any] = {}
    for key, value in data.items():
        new = _snake(key) if isinstance(key, str) else key
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


# --------------------------------------------------------------------------- files


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            with contextlib.suppress(TypeError):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _load_yaml(path: Path) -> Any:
    text = _read_text(path)
    try:
        return yaml.load(text, Loader=_StrictYamlLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        detail = f"{context}, {problem}" if context else problem
        if mark is not None:
            raise ConfigError(
                f"{path}:{mark.line + 1}: YAML syntax error: {detail} (column {mark.column + 1})"
            ) from None
        raise ConfigError(f"{path}: YAML syntax error: {detail}") from None


def _load_toml(path: Path) -> Any:
    text = _read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        if found:
            msg = str(exc)[: found.start()].strip()
            raise ConfigError(
                f"{path}:{found.group(1)}: TOML syntax error: {msg} (column {found.group(2)})"
            ) from None
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None


def _load_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}:{exc.lineno}: JSON syntax error: {exc.msg} (column {exc.colno})"
        ) from None


def _load_python(path: Path) -> Any:
    """Run a PBG-style config (the file the user named) and call get_torchbiggraph_config()."""
    target = str(path.resolve())

    def line_of(exc: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == target]
        return f":{frames[-1].lineno}" if frames else ""

    try:
        namespace = runpy.run_path(target, run_name="__bigembed_config__")
    except SyntaxError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: Python syntax error: {exc.msg}") from None
    except Exception as exc:
        raise ConfigError(
            f"{path}{line_of(exc)}: error while running the config: {type(exc).__name__}: {exc}"
        ) from None
    func = namespace.get("get_torchbiggraph_config")
    if not callable(func):
        raise ConfigError(
            f"{path}: a Python config must define get_torchbiggraph_config() returning a dict"
        )
    try:
        return func()
    except Exception as exc:
        raise ConfigError(
            f"{path}{line_of(exc)}: get_torchbiggraph_config() failed: {type(exc).__name__}: {exc}"
        ) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw dict of a .yaml/.yml/.toml/.json/.py config file, or a ConfigError."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(
            f"{path}: unsupported config format {suffix or '(no extension)'!r} "
            f"(use {', '.join(FORMATS)})"
        )
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a config file")
    loader = {
        ".yaml": _load_yaml,
        ".yml": _load_yaml,
        ".toml": _load_toml,
        ".json": _load_json,
        ".py": _load_python,
    }[suffix]
    data = loader(path)
    if data is None:
        raise ConfigError(f"{path}: the config is empty")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the config must be a mapping of keys to values, got {type(data).__name__}"
        )
    return data


# --------------------------------------------------------------------------- type helpers


def _strip(annotation: Any) -> tuple[Any, bool]:
    """(annotation without Annotated/Optional wrappers, whether None is allowed)."""
    nullable = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin is Union or origin is types.UnionType:
            args = [a for a in get_args(annotation) if a is not type(None)]
            nullable = nullable or len(args) < len(get_args(annotation))
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation, nullable
        else:
            return annotation, nullable


def _parses_text(annotation: Any) -> bool:
    """Whether the field's type is marked :data:`~bigembed.config.types.PARSES_TEXT`."""
    origin = get_origin(annotation)
    if origin is Annotated:
        args = get_args(annotation)
        return PARSES_TEXT in args[1:] or _parses_text(args[0])
    if origin is Union or origin is types.UnionType:
        return any(_parses_text(a) for a in get_args(annotation))
    return False


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _child(annotation: Any) -> tuple[str, Any]:
    """How a field nests: ('model', M), ('dict', V), ('list', V) or ('leaf', T)."""
    ann, _ = _strip(annotation)
    origin = get_origin(ann)
    if _is_model(ann):
        return "model", ann
    if origin is dict:
        return "dict", _strip(get_args(ann)[1])[0]
    if origin in (list, tuple):
        return "list", _strip(get_args(ann)[0])[0]
    return "leaf", ann


def _suggest(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------- overrides

_NULLS = frozenset({"null", "none", "~"})
_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


def _convert(text: str, annotation: Any, fail: Any) -> Any:
    """Convert an override's text to the field's type; ``fail(msg)`` raises."""
    ann, nullable = _strip(annotation)
    if nullable and text.strip().lower() in _NULLS:
        return None
    if _parses_text(annotation):
        return text  # the field's own validator reads the text (e.g. a size with a unit)
    kind, inner = _child(ann)
    if kind == "list" and not _is_model(inner):
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
            name = _snake(parts[i])
            fields = current.model_fields
            if name not in fields:
                where = f"{path}: " if path else ""
                fail(f"{where}unknown key {parts[i]!r}{_suggest(name, list(fields))}")
            path = f"{path}.{name}" if path else name
            annotation = fields[name].annotation
            if i == len(parts) - 1:
                container[name] = _convert(value, annotation, lambda m, p=path: fail(f"{p}: {m}"))
                break
            kind, inner = _child(annotation)
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
            if not _is_model(inner):
                fail(f"{item_path} is a single value and has no sub-keys")
            if not isinstance(items[sel], dict):
                fail(f"{item_path}: the config has no mapping here")
            container, current, path, i = items[sel], inner, item_path, i + 2
    return data


# --------------------------------------------------------------------------- errors


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
        if not _is_model(current) or loc[i] not in current.model_fields:
            return None
        kind, inner = _child(current.model_fields[loc[i]].annotation)
        if kind == "model":
            current, i = inner, i + 1
        elif kind in ("dict", "list"):
            current, i = inner, i + 2
        else:
            return None
    return current if _is_model(current) else None


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
        return [f"{where}unknown key {loc[-1]!r}{_suggest(str(loc[-1]), options)}"]
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
        text += _suggest(err["input"].lower(), options)
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


# --------------------------------------------------------------------------- help text


def _type_name(annotation: Any) -> str:
    ann, nullable = _strip(annotation)
    origin = get_origin(ann)
    if origin is Literal:
        name = "|".join(str(a) for a in get_args(ann))
    elif origin in (list, tuple):
        name = f"list[{_type_name(get_args(ann)[0])}]"
    elif origin is dict:
        key, value = get_args(ann)
        name = f"dict[{_type_name(key)}, {_type_name(value)}]"
    elif isinstance(ann, type):
        name = ann.__name__
    else:
        name = str(ann)
    return f"{name} | null" if nullable else name


def _field_type_name(annotation: Any, metadata: Sequence[Any]) -> str:
    """The type column: the allowed names of a :class:`OneOf` field, else the annotation."""
    for item in metadata:
        if isinstance(item, OneOf):
            return "|".join(item.names)
    return _type_name(annotation)


def _constraints(metadata: Sequence[Any]) -> str:
    parts = []
    for item in metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sym} {value}")
    return f" ({', '.join(parts)})" if parts else ""


def _default_text(default: Any) -> str:
    if default is PydanticUndefined:
        return "required"
    if default is None:
        return "null"
    if isinstance(default, BaseModel):  # a section: its keys are listed with their defaults
        return "(section)"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def describe_keys(
    sections: Sequence[tuple[str, type[BaseModel]]],
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of each (key prefix, model) section."""
    return [
        (
            prefix + name,
            _field_type_name(field.annotation, field.metadata) + _constraints(field.metadata),
            _default_text(field.get_default(call_default_factory=True)),
            field.description or "",
        )
        for prefix, model in sections
        for name, field in model.model_fields.items()
    ]


def format_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A plain-text table; the last column is left unpadded (descriptions are long)."""
    widths = [max(len(r[c]) for r in [*rows, header]) for c in range(len(header) - 1)]

    def line(row: Sequence[str]) -> str:
        return "  ".join([*(v.ljust(w) for v, w in zip(row, widths, strict=False)), row[-1]])

    return "\n".join(
        [line(header), line([*("-" * w for w in widths), "-" * len(header[-1])])]
        + [line(r) for r in rows]
    )
