"""The one ctypes mirror of ``native_step.cpp``'s C ABI, and the check that it matches.

Every structure the kernels take (:class:`StepArgs`, :class:`EvalArgs`), the codes their
integer fields use and the entry points' signatures live here and nowhere else. A mirror that
disagrees with the C side would make the kernel read and write the wrong bytes without any
error, so the library describes its own structs (a layout table: per struct its size, per field
its name, offset, size and kind) and :func:`check_layout` compares that table with these
classes when the library is loaded; any difference refuses the library (training then takes
the eager path, saying why).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

Pointer = ctypes.c_void_p
Int = ctypes.c_int64
Double = ctypes.c_double

#: The kernels' code of each loss (``loss_kind``).
LOSS_KINDS = {"softmax": 0, "ranking": 1, "logistic": 2}
#: The kernels' code of each relation operator (``op_kind``).
OPERATOR_KINDS = {"none": 0, "translation": 1, "diagonal": 2}


class StepArgs(ctypes.Structure):
    """``StepArgs``: one training step (inputs, then the outputs ``loss`` and violators)."""

    _fields_ = [
        *((name, Pointer) for name in ("lhs_emb", "lhs_state", "rhs_emb", "rhs_state")),
        *((name, Pointer) for name in ("lhs_idx", "rhs_idx", "lhs_uidx", "rhs_uidx")),
        *((name, Pointer) for name in ("weight", "op_param", "op_grad")),
        *((name, Pointer) for name in ("lhs_glob", "rhs_glob", "lhs_glob_grad", "rhs_glob_grad")),
        *((name, Int) for name in ("lhs_rows", "rhs_rows", "dim", "batch", "num_batch_negs")),
        *((name, Int) for name in ("num_uniform", "uniform_group", "cos", "loss_kind")),
        *((name, Int) for name in ("op_kind", "enable_lhs", "enable_rhs", "shared_table")),
        ("self_negative", Int),
        *((name, Double) for name in ("margin", "rel_weight", "lr", "loss")),
        ("violators_lhs", Int),
        ("violators_rhs", Int),
    ]


class EvalArgs(ctypes.Structure):
    """``EvalArgs``: one corrupted side of one batch of the withheld-edge eval (inputs, then
    the per-positive output arrays)."""

    _fields_ = [
        *((name, Pointer) for name in ("lhs_emb", "rhs_emb", "lhs_idx", "rhs_idx", "uidx")),
        *((name, Pointer) for name in ("op_param", "lhs_glob", "rhs_glob")),
        *((name, Int) for name in ("dim", "batch", "num_batch_negs", "num_uniform")),
        *((name, Int) for name in ("uniform_group", "cos", "loss_kind", "op_kind", "side")),
        ("margin", Double),
        *((name, Pointer) for name in ("at_least", "below", "valid", "row_loss")),
    ]


#: The structures the C side describes in its layout table, by their C name.
STRUCTS: dict[str, type[ctypes.Structure]] = {"StepArgs": StepArgs, "EvalArgs": EvalArgs}
#: The entry points: each takes a pointer to its structure and returns 0.
ENTRY_POINTS = ("bigembed_native_step", "bigembed_native_eval")
_KINDS = {Pointer: "p", Int: "i", Double: "f"}


@dataclass(frozen=True)
class Row:
    """One row of a layout table: a struct's size (``field`` empty, ``kind`` ``s``) or one of
    its fields."""

    type: str
    field: str
    offset: int
    size: int
    kind: str


def mirror_layout() -> list[Row]:
    """The layout table of the ctypes classes (:data:`STRUCTS`), in the C side's form."""
    rows = []
    for name, cls in STRUCTS.items():
        rows.append(Row(name, "", 0, ctypes.sizeof(cls), "s"))
        for field, ctype, *_bits in cls._fields_:
            desc = getattr(cls, field)
            rows.append(Row(name, field, desc.offset, desc.size, _KINDS.get(ctype, "?")))
    return rows


def library_layout(lib: ctypes.CDLL) -> list[Row]:
    """The layout table the library exports (``bigembed_native_layout_row``)."""
    count = lib.bigembed_native_layout_rows
    count.restype = ctypes.c_int64
    count.argtypes = []
    row = lib.bigembed_native_layout_row
    row.restype = ctypes.c_int
    row.argtypes = [
        ctypes.c_int64,
        *[ctypes.POINTER(ctypes.c_char_p)] * 2,
        *[ctypes.POINTER(ctypes.c_int64)] * 2,
        ctypes.POINTER(ctypes.c_char),
    ]
    out = []
    for i in range(int(count())):
        type_, field = ctypes.c_char_p(), ctypes.c_char_p()
        offset, size, kind = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_char()
        refs = (type_, field, offset, size, kind)
        if row(i, *(ctypes.byref(r) for r in refs)) != 0:
            break
        out.append(
            Row(
                (type_.value or b"").decode(),
                (field.value or b"").decode(),
                offset.value,
                size.value,
                kind.value.decode(),
            )
        )
    return out


def compare_layouts(native: list[Row], mirror: list[Row]) -> str | None:
    """The first difference between the two tables, in words; None when they are equal."""
    for k, (c_row, py_row) in enumerate(zip(native, mirror, strict=False)):
        if c_row != py_row:
            return f"row {k}: the C side has {_show(c_row)}, the ctypes mirror {_show(py_row)}"
    if len(native) != len(mirror):
        longer, side = (native, "C side") if len(native) > len(mirror) else (mirror, "mirror")
        return f"only the {side} has {_show(longer[min(len(native), len(mirror))])}"
    return None


def _show(row: Row) -> str:
    if row.kind == "s":
        return f"struct {row.type} of {row.size} bytes"
    return f"{row.type}.{row.field} at offset {row.offset} ({row.size} bytes, kind {row.kind})"


def check_layout(lib: ctypes.CDLL) -> str | None:
    """Why ``lib`` must not be called through this mirror (its layout table differs, or it
    lacks an entry point), or None when it matches. Declares the entry points' signatures."""
    try:
        native = library_layout(lib)
        for name in ENTRY_POINTS:
            entry = getattr(lib, name)
            entry.restype = ctypes.c_int
            entry.argtypes = [ctypes.c_void_p]
    except AttributeError as exc:  # an older build: no layout table, or no such entry point
        return f"the library lacks {exc}"
    difference = compare_layouts(native, mirror_layout())
    return None if difference is None else f"ABI mismatch: {difference}"
