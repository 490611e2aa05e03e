"""One JSON form per record type: pydantic dataclasses and their schema, nothing hand-written.

A record that is written to disk or sent between processes (the training stats records, the
checkpoint metadata, the evaluation report) is a ``pydantic.dataclasses.dataclass`` (with
``config=RECORD_CONFIG``) that also derives from :class:`JsonForm`. Its fields ARE its JSON
form: a field's name is its key (or its ``serialization_alias``), ``omit_none()`` leaves a key out
while its value is None, and the few records whose on-disk layout is not their fields (keys
spliced from a nested record, a list instead of an object) say so with a ``model_serializer`` /
``model_validator`` of their own.
Adding an optional key is one line: ``name: int | None = omit_none()``.

:meth:`JsonForm.from_json` validates with the same schema and turns the first failure into one
line (``iteration.epoch_idx is -1, not a non-negative integer``) raised as
:class:`RecordError`, or as the error a record family chooses (:meth:`JsonForm.json_error`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import ConfigDict, Field, PlainValidator, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

__all__ = [
    "RECORD_CONFIG",
    "JsonForm",
    "NonNegativeInt",
    "RecordError",
    "describe_error",
    "omit_none",
]

_J = TypeVar("_J", bound="JsonForm")


class RecordError(ValueError):
    """A JSON object does not have the form of the record it should be (one line)."""


def _is_none(value: object) -> bool:
    return value is None


#: The config of every record: a field whose key is not its name still takes its name.
RECORD_CONFIG = ConfigDict(validate_by_name=True, validate_by_alias=True)


def omit_none(default: Any = None, key: str | None = None) -> Any:
    """A field (default None) that is left out of the JSON form while it is None; ``key``: its
    key when that is not its name (the constructor still takes the name)."""
    return Field(
        default=default, exclude_if=_is_none, validation_alias=key, serialization_alias=key
    )


def _non_negative(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PydanticCustomError("non_negative", "not a non-negative integer")
    return value


#: An ``int`` that must be written as one (no bool, float or string) and is >= 0.
NonNegativeInt = Annotated[int, PlainValidator(_non_negative)]

_NOT_AN_OBJECT = {"dict_type", "dataclass_type", "model_type", "dataclass_exact_type"}


def describe_error(exc: ValidationError) -> str:
    """The first failure of ``exc`` as one line naming the key: ``KEY is VALUE, WHY``."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    kind, msg = err["type"], err["msg"]
    if not loc:
        return msg[0].lower() + msg[1:]
    if kind == "detail":  # a validator's own words, after the key
        return f"{loc}{msg}"
    if kind == "missing":
        return f"no {loc!r}"
    if kind in _NOT_AN_OBJECT:
        return f"{loc} is not an object"
    if err["input"] is None:
        return f"{loc} is null"
    if kind == "non_negative":
        return f"{loc} is {err['input']!r}, not a non-negative integer"
    return f"{loc} is {err['input']!r}: {msg[0].lower() + msg[1:]}"


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


class JsonForm:
    """Base of the records with a JSON form (see the module docstring)."""

    #: What a failure to read is called in :meth:`json_error` (``"corrupt metadata"``).
    json_what: ClassVar[str] = ""

    def to_json(self) -> Any:
        """The JSON form: dicts, lists, numbers and strings, as the fields' types declare
        (Python mode, so that a NaN loss stays NaN as ``json.dumps`` writes it)."""
        return _adapter(type(self)).dump_python(self, by_alias=True)

    @classmethod
    def from_json(cls: type[_J], data: object, source: object = None) -> _J:
        """The record of a parsed JSON form; raises :meth:`json_error` naming ``source``."""
        try:
            return _adapter(cls).validate_python(data)
        except ValidationError as exc:
            raise cls.json_error(source, describe_error(exc)) from None

    @classmethod
    def json_error(cls, source: object, detail: str) -> Exception:
        """The error raised for a JSON form that does not validate."""
        what = f"{cls.json_what} ({detail})" if cls.json_what else detail
        return RecordError(f"{source}: {what}" if source is not None else what)
