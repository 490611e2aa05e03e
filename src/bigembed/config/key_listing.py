"""The ``bigembed config keys`` listing: every key with its type, default, PBG status and
description (the help text PBG users expect), as one line per key cut to the terminal's width;
:mod:`bigembed.config.key_help` shows one key in full."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from bigembed.config.fields import strip_annotation
from bigembed.config.pbg_keys import PBG_DIFFERENCES, pbg_status
from bigembed.config.schema import ConfigSchema
from bigembed.config.sections import (
    CommunicationSchema,
    EarlyStoppingSchema,
    EdgeFilesSchema,
    EntitySchema,
    RelationSchema,
    TuneParamSchema,
    TuneSchema,
)
from bigembed.config.types import OneOf

KEY_WIDTH = 26  # a longer key gets a line of its own
DEFAULT_WIDTH = 11
MIN_WIDTH = 60
MIN_TEXT_WIDTH = 10


def _type_name(annotation: Any) -> str:
    ann, nullable = strip_annotation(annotation)
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


def _allowed(annotation: Any, metadata: Sequence[Any]) -> tuple[str, ...]:
    """The names an enum-like field accepts (a :class:`OneOf` or a ``Literal``), else ()."""
    for item in metadata:
        if isinstance(item, OneOf):
            return tuple(item.names)
    ann, _ = strip_annotation(annotation)
    if get_origin(ann) is Literal:
        return tuple(str(a) for a in get_args(ann))
    return ()


@dataclass(frozen=True)
class KeyInfo:
    """One config key as ``bigembed config keys`` shows it."""

    key: str
    type: str
    default: str
    description: str
    allowed: tuple[str, ...] = ()


def describe_keys(sections: Sequence[tuple[str, type[BaseModel]]]) -> list[KeyInfo]:
    """Every field of each (key prefix, model) section."""
    return [
        KeyInfo(
            prefix + name,
            _field_type_name(field.annotation, field.metadata) + _constraints(field.metadata),
            _default_text(field.get_default(call_default_factory=True)),
            field.description or "",
            _allowed(field.annotation, field.metadata),
        )
        for prefix, model in sections
        for name, field in model.model_fields.items()
    ]


def key_infos() -> list[KeyInfo]:
    """Every config key, in schema order."""
    return describe_keys(
        [
            ("", ConfigSchema),
            ("entities.TYPE.", EntitySchema),
            ("relations[i].", RelationSchema),
            ("communication.", CommunicationSchema),
            ("early_stopping.", EarlyStoppingSchema),
            ("edge_files.", EdgeFilesSchema),
            ("tune.", TuneSchema),
            ("tune.params.KEY.", TuneParamSchema),
        ]
    )


def config_keys() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every config key, in schema order."""
    return [(k.key, k.type, k.default, k.description) for k in key_infos()]


def terminal_width() -> int:
    """Columns to fit (``COLUMNS``, else the terminal's; 100 when output is not a terminal)."""
    return max(MIN_WIDTH, shutil.get_terminal_size((100, 24)).columns)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters (``...`` marks a cut)."""
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def format_config_keys(width: int | None = None) -> str:
    """Every key on one line (key, default, pbg, the start of its description) within ``width``
    columns, then how each ``differs`` key differs from PBG, and how to see one key in full."""
    width = width or terminal_width()
    infos = key_infos()
    key_w = min(max(len(k.key) for k in infos), KEY_WIDTH)
    default_w = min(max(len(k.default) for k in infos), DEFAULT_WIDTH)
    pbg_w = len("differs")
    text_w = max(width - key_w - default_w - pbg_w - 6, MIN_TEXT_WIDTH)

    def line(key: str, default: str, pbg: str, text: str) -> str:
        cells = [key.ljust(key_w), cut(default, default_w).ljust(default_w), pbg.ljust(pbg_w)]
        return "  ".join([*cells, textwrap.shorten(text, text_w, placeholder="...")]).rstrip()

    lines = [
        line("key", "default", "pbg", "description"),
        line("-" * key_w, "-" * default_w, "-" * pbg_w, "-" * len("description")),
    ]
    for info in infos:
        key = info.key
        if len(key) > key_w:  # a long key gets a line of its own
            lines.append(key)
            key = ""
        lines.append(line(key, info.default, pbg_status(info.key), info.description))
    notes = [
        textwrap.fill(f"{key}: {how}", width, initial_indent="  ", subsequent_indent="      ")
        for key, how in PBG_DIFFERENCES.items()
    ]
    legend = (
        "pbg: same = as in PyTorch-BigGraph, differs = see below, new = bigembed only. "
        "Keys that behave differently from PBG (docs/pbg_compatibility.md):"
    )
    details = (
        "One key in full (type, allowed values, default, description): "
        "bigembed config keys KEY... (e.g. bigembed config keys relations[i].operator)"
    )
    return "\n".join(
        [*lines, "", textwrap.fill(legend, width), *notes, "", textwrap.fill(details, width)]
    )
