"""Reading a config file: YAML, TOML, JSON, or PBG's Python format, into a raw dict.

Every failure is a :class:`~bigembed.errors.ConfigError` whose message starts with the file
name (``FILE:`` or ``FILE:LINE:``), then what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import re
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml

from bigembed.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FORMATS = (".yaml", ".yml", ".toml", ".json", ".py")


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


def _what_happened(exc: BaseException) -> str:
    """``ValueError: nope`` or ``it called sys.exit(3)``: the reason a Python config failed."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) (a config must return its dict, not exit)"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _load_python(path: Path) -> Any:
    """Run a PBG-style config (the file the user named) and call get_torchbiggraph_config().

    Whatever the file does wrong, an exception or ``sys.exit()`` (SystemExit would otherwise end
    bigembed silently with the config's status), is one ConfigError naming the file and line.
    """
    target = str(path.resolve())

    def line_of(exc: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == target]
        return f":{frames[-1].lineno}" if frames else ""

    try:
        namespace = runpy.run_path(target, run_name="__bigembed_config__")
    except SyntaxError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: Python syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        raise ConfigError(
            f"{path}{line_of(exc)}: error while running the config: {_what_happened(exc)}"
        ) from None
    func = namespace.get("get_torchbiggraph_config")
    if not callable(func):
        raise ConfigError(
            f"{path}: a Python config must define get_torchbiggraph_config() returning a dict"
        )
    try:
        return func()
    except (Exception, SystemExit) as exc:
        raise ConfigError(
            f"{path}{line_of(exc)}: get_torchbiggraph_config() failed: {_what_happened(exc)}"
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
