"""Keep freed heap memory in the process instead of handing it back to the kernel.

A training step allocates and frees the same few megabytes of temporaries (score tiles, gathered
rows, gradients) every batch. With glibc's defaults, large blocks are ``mmap``-ed and unmapped
again and the heap top is trimmed, so every batch pays page faults (and the zeroing of fresh,
often huge, pages) for memory it just gave back. Raising the mmap and trim thresholds keeps the
blocks on the heap for reuse (BENCHMARKS.md has the gain). The cost is that up to
``TRIM_THRESHOLD`` of freed memory stays mapped in each worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit systems
TRIM_THRESHOLD = 256 << 20
TOP_PAD = 64 << 20

_done = False


def keep_freed_memory() -> bool:
    """Tune glibc malloc for this process (once); False where it is not glibc or opted out.

    ``BIGEMBED_MALLOC_TUNING=0`` leaves malloc alone, as do the ``MALLOC_*_`` environment
    variables when the user set them (glibc already applied those).
    """
    global _done
    if _done:
        return True
    if os.environ.get("BIGEMBED_MALLOC_TUNING", "1") == "0":
        return False
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
        )
    )
    logger.debug("malloc tuning %s", "applied" if ok else "refused")
    _done = ok
    return ok
