"""How the loaders walk the schema: a field's annotation without its wrappers, how it nests,
whether it parses its own text; and the "did you mean" of an unknown name.

Shared by ``-p`` overrides (:mod:`bigembed.config.overrides`), error messages
(:mod:`bigembed.config.validation_errors`) and the key listing
(:mod:`bigembed.config.key_listing`); nothing here imports the schema.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from bigembed.config.types import PARSES_TEXT


def strip_annotation(annotation: Any) -> tuple[Any, bool]:
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


def parses_text(annotation: Any) -> bool:
    """Whether the field's type is marked :data:`~bigembed.config.types.PARSES_TEXT`."""
    origin = get_origin(annotation)
    if origin is Annotated:
        args = get_args(annotation)
        return PARSES_TEXT in args[1:] or parses_text(args[0])
    if origin is Union or origin is types.UnionType:
        return any(parses_text(a) for a in get_args(annotation))
    return False


def is_model(annotation: Any) -> bool:
    """Whether ``annotation`` is a schema class (a section)."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def nesting(annotation: Any) -> tuple[str, Any]:
    """How a field nests: ('model', M), ('dict', V), ('list', V) or ('leaf', T)."""
    ann, _ = strip_annotation(annotation)
    origin = get_origin(ann)
    if is_model(ann):
        return "model", ann
    if origin is dict:
        return "dict", strip_annotation(get_args(ann)[1])[0]
    if origin in (list, tuple):
        return "list", strip_annotation(get_args(ann)[0])[0]
    return "leaf", ann


def suggest(word: str, options: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``word``, or nothing."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
