"""Building and loading the native kernels (``native_step.cpp``: the training step and the
withheld-edge eval's scoring): once per machine, cached.

The kernel is plain C++ with a C ABI (no torch headers, no Python headers): the system
compiler (``$CXX``, else ``c++``) builds it in about 1.5 s into a per-user cache
(``$BIGEMBED_CACHE_DIR``, else ``$XDG_CACHE_HOME/bigembed``, else ``~/.cache/bigembed``) under a
name keyed by the source, the compiler, its flags and the machine, and every later process
(Hogwild workers included) only loads it with :mod:`ctypes`. A file lock makes concurrent
first uses build it once. Without a working compiler (or with ``BIGEMBED_NATIVE=0``) nothing
is built and :func:`native_library` returns None: training takes the eager path, with one
warning per process saying why.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_step.cpp")
#: The kernel's ABI version (``bigembed_native_abi()``): bumped with ``StepArgs``' or
#: ``EvalArgs``' layout or a new entry point.
ABI = 2
#: Seconds a build may take before it is given up (the eager path is used then).
BUILD_TIMEOUT = 120


def cache_dir() -> Path:
    """Where built kernels are kept."""
    env = os.environ.get("BIGEMBED_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "bigembed"


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


def compile_flags() -> list[str]:
    """Optimisation and the vector units torch itself dispatches to on this machine."""
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno"]
    if platform.machine() in ("x86_64", "AMD64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2",
        "AVX512",
    ):
        flags += ["-mavx2", "-mfma"]
    return flags


def library_path() -> Path:
    """The cached library's path for this source, compiler, flags and machine."""
    key = hashlib.sha256(SOURCE.read_bytes())
    for part in (compiler(), *compile_flags(), platform.machine(), platform.system()):
        key.update(b"\0" + part.encode())
    return cache_dir() / "native" / f"bigembed_step-{key.hexdigest()[:16]}.so"


def _build(path: Path) -> None:
    """Compile the kernel to ``path`` (atomically: a temporary file renamed in place)."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise OSError(f"no C++ compiler {cxx!r} on PATH (set CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cxx, *compile_flags(), str(SOURCE), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise OSError(f"{cxx} failed: {lines[0] if lines else done.returncode}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.bigembed_native_abi.restype = ctypes.c_int
    if lib.bigembed_native_abi() != ABI:
        raise OSError(f"{path} has ABI {lib.bigembed_native_abi()}, expected {ABI}")
    for entry in (lib.bigembed_native_step, lib.bigembed_native_eval):
        entry.restype = ctypes.c_int
        entry.argtypes = [ctypes.c_void_p]
    return lib


@functools.cache
def native_library() -> ctypes.CDLL | None:
    """The loaded kernel, built first if this machine has none cached; None (the eager path)
    when disabled or no compiler can build it. Decided once per process."""
    if os.environ.get("BIGEMBED_NATIVE", "1") == "0":
        return None
    try:
        path = library_path()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.parent / ".build.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not path.exists():
                    _build(path)
        return _load(path)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("native step kernel unavailable, training takes the eager path: %s", exc)
        return None
