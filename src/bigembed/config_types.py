"""Value types of the config schema, parsed the way PyTorch-BigGraph parses them.

PBG's rules: ints must be ints, floats accept ints, bools accept true/false/yes/no/on/off/1/0
strings (any case), enums are matched case-insensitively. YAML 1.1 reads ``1e-3`` as a
*string* (it wants a dot: ``1.0e-3``), so numbers written that way are accepted too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


def _to_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise PydanticCustomError(
        "bool_type", "input should be a boolean (true/false/yes/no/on/off/1/0)"
    )


def _to_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "input should be an integer, not a boolean")
    if isinstance(value, int):
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if number is not None and number == number and abs(number) != float("inf"):
        if number.is_integer():
            return int(number)
        raise PydanticCustomError("int_from_float", "input should be a whole number")
    raise PydanticCustomError("int_type", "input should be a valid integer")


def _to_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "input should be a number, not a boolean")
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise PydanticCustomError("float_type", "input should be a valid number")
    if number != number or abs(number) == float("inf"):
        raise PydanticCustomError("finite_number", "input should be a finite number")
    return number


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _n3(value: Any) -> Any:
    return "N3" if isinstance(value, str) and value.strip().lower() == "n3" else value


Bool = Annotated[bool, BeforeValidator(_to_bool)]
Int = Annotated[int, BeforeValidator(_to_int)]
Float = Annotated[float, BeforeValidator(_to_float)]

OperatorName = Literal["none", "translation", "diagonal", "linear", "affine", "complex_diagonal"]
ComparatorName = Literal["dot", "cos", "l2", "squared_l2"]
LossName = Literal["ranking", "logistic", "softmax"]
BucketOrderName = Literal["random", "affinity", "inside_out", "outside_in"]
ComputeDtype = Literal["float32", "bfloat16"]

Operator = Annotated[OperatorName, BeforeValidator(_lower)]
Comparator = Annotated[ComparatorName, BeforeValidator(_lower)]
Loss = Annotated[LossName, BeforeValidator(_lower)]
BucketOrder = Annotated[BucketOrderName, BeforeValidator(_lower)]
Regularizer = Annotated[Literal["N3"], BeforeValidator(_n3)]
Dtype = Annotated[ComputeDtype, BeforeValidator(_lower)]
