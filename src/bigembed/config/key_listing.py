"""The ``bigembed config keys`` listing: every key with its type, default, PBG status and
description, as a plain-text table (the help text PBG users expect)."""

from __future__ import annotations

from collections.abc import Sequence
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


def config_keys() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every config key, in schema order."""
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


def format_config_keys() -> str:
    """A plain-text table of every key (the help text PBG users expect), with a ``pbg`` column
    and, after the table, how each ``differs`` key differs from PBG."""
    rows = [(k, t, d, pbg_status(k), text) for k, t, d, text in config_keys()]
    table = format_table(rows, ("key", "type", "default", "pbg", "description"))
    notes = [f"  {key}: {how}" for key, how in PBG_DIFFERENCES.items()]
    return "\n".join(
        [
            table,
            "",
            "pbg: same = as in PyTorch-BigGraph, differs = see below, new = bigembed only.",
            "Keys that behave differently from PBG (docs/pbg_compatibility.md):",
            *notes,
        ]
    )
