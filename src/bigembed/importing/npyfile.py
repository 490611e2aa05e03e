"""A 1-D ``.npy`` file that is written by appending and gets its final shape at the end.

The header is reserved at a fixed size (128 bytes, so the data stays 64-byte aligned as
numpy's own writer does) and rewritten by :meth:`AppendableNpy.finish` with the real length.
The result is a standard ``.npy``: ``np.load(path, mmap_mode="r")`` reads it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

HEADER_SIZE = 128
_MAGIC = b"\x93NUMPY\x01\x00"


def npy_header(dtype: np.dtype, length: int) -> bytes:
    """The 128-byte version-1.0 header of a 1-D little-endian array of ``length`` items."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype).newbyteorder("<"))
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': ({length},), }}"
    body_size = HEADER_SIZE - len(_MAGIC) - 2
    text = text.ljust(body_size - 1) + "\n"
    if len(text) != body_size:
        raise ValueError(f"npy header too long for {dtype} x {length}")
    return _MAGIC + struct.pack("<H", body_size) + text.encode("latin1")


class AppendableNpy:
    """Append 1-D chunks of one dtype to a ``.npy`` file; :meth:`finish` fixes the header."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path = path
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.length = 0
        with open(path, "wb") as f:
            f.write(npy_header(self.dtype, 0))

    def append(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        data = np.ascontiguousarray(values, dtype=self.dtype)
        with open(self.path, "ab") as f:
            f.write(data.data.cast("B"))
        self.length += int(data.size)

    def finish(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, npy_header(self.dtype, self.length), 0)
        finally:
            os.close(fd)
