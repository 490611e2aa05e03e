"""Building, finding and loading the native kernels (``native_step.cpp``).

The kernel is plain C++ with a C ABI (no torch or Python headers), built by the system C++
compiler (``$CXX``, else ``c++``) into a shared library whose file name carries a hash of the
source, the compile flags and the machine (:func:`library_name`): a library built from another
source, or for other vector units, is never loaded. The loader looks for it, in order, in

1. ``$BIGEMBED_KERNEL_DIR`` (a directory prepared with ``bigembed build-kernels --into DIR``);
2. this package's own folder (``bigembed build-kernels --into-package``, or an install step:
   for a cluster image or a read-only home);
3. the user cache (``$BIGEMBED_CACHE_DIR``, else ``$XDG_CACHE_HOME/bigembed``, else
   ``~/.cache/bigembed``), where it is built on first use when the machine has a compiler.

Builds are atomic (a temporary file renamed in place) and, in the cache, serialised by a file
lock so that concurrent first uses build once. Loading compares the library's layout table
with the ctypes mirror (:mod:`bigembed.kernels.native.abi`) and refuses any difference. Every
failure is a :class:`NativeUnavailable` whose message is the reason shown to the user.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from bigembed.atomic import atomic_file
from bigembed.kernels.native.abi import check_layout

SOURCE = Path(__file__).with_name("native_step.cpp")
#: The package's own folder: the second place the loader looks.
PACKAGE_DIR = SOURCE.parent
#: Seconds a build may take before it is given up.
BUILD_TIMEOUT = 120


class NativeUnavailable(Exception):
    """The native kernel cannot be built or loaded here; the message says why (one line)."""


def cache_dir() -> Path:
    """Where the user cache keeps built kernels (the third place the loader looks)."""
    env = os.environ.get("BIGEMBED_CACHE_DIR")
    if env:
        return Path(env) / "native"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "bigembed" / "native"


def search_dirs() -> list[Path]:
    """Where the loader looks for a built kernel, in order."""
    dirs = [PACKAGE_DIR, cache_dir()]
    env = os.environ.get("BIGEMBED_KERNEL_DIR")
    return [Path(env), *dirs] if env else dirs


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


def library_name() -> str:
    """The library's file name for this source, these flags and this machine."""
    key = hashlib.sha256(SOURCE.read_bytes())
    for part in (*compile_flags(), platform.machine(), platform.system()):
        key.update(b"\0" + part.encode())
    return f"bigembed_native-{key.hexdigest()[:16]}.so"


def find_library() -> Path | None:
    """The first built kernel for this source and machine in :func:`search_dirs`, if any."""
    name = library_name()
    for directory in search_dirs():
        if (directory / name).is_file():
            return directory / name
    return None


def no_compiler_reason(cxx: str) -> str:
    return (
        f"no C++ compiler found ({cxx!r}: $CXX, else c++); run `bigembed build-kernels` on a "
        "machine with one, or install g++"
    )


def _unwritable(directory: Path, exc: Exception) -> NativeUnavailable:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return NativeUnavailable(
        f"cannot build the kernel into {directory} ({reason}); build it ahead with "
        "`bigembed build-kernels --into DIR` and set BIGEMBED_KERNEL_DIR=DIR"
    )


def build_library(directory: Path) -> Path:
    """Compile the kernel into ``directory`` (atomically); returns the library's path."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise NativeUnavailable(no_compiler_reason(cxx))
    path = directory / library_name()
    try:
        with atomic_file(path) as tmp:
            done = subprocess.run(
                [cxx, *compile_flags(), str(SOURCE), "-o", str(tmp)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT,
            )
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                raise NativeUnavailable(
                    f"{cxx} failed to build {SOURCE.name}: "
                    f"{lines[0] if lines else f'exit status {done.returncode}'}"
                )
    except (OSError, subprocess.SubprocessError) as exc:
        raise _unwritable(directory, exc) from exc
    return path


def find_or_build() -> Path:
    """A built kernel: found (:func:`find_library`) or built into the user cache now."""
    found = find_library()
    if found is not None:
        return found
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = directory / library_name()
            return path if path.is_file() else build_library(directory)
    except OSError as exc:
        raise _unwritable(directory, exc) from exc


@functools.cache
def load_library(path: str) -> ctypes.CDLL:
    """The library at ``path``, loaded once per process and checked against the mirror."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise NativeUnavailable(f"cannot load {path}: {exc}") from exc
    problem = check_layout(lib)
    if problem is not None:
        raise NativeUnavailable(f"{path}: {problem}")
    return lib


def native_library() -> ctypes.CDLL | None:
    """The kernel found or built and loaded, or None where it is unavailable (for tests and
    tools; a training run decides once, with its reason: :mod:`bigembed.kernels.native.choice`)."""
    try:
        return load_library(str(find_or_build()))
    except NativeUnavailable:
        return None
