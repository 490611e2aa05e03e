"""The compute dtype of the score products (``compute_dtype``), and why: ``auto`` decided from
this machine.

bf16 products pay only where the CPU multiplies bf16 in hardware (x86 AVX-512 BF16 or AMX,
Arm's BF16 extension); elsewhere torch emulates them, tens of times slower than fp32. ``auto``
therefore asks two questions. Does the CPU announce bf16 matrix units (its flags in
``/proc/cpuinfo``; where that file does not exist the timing alone decides)? If it does, are bf16
products measurably faster than fp32 ones here, at least :data:`BF16_SPEEDUP` times fp32's rate?
The timing (square products of :data:`PROBE_SIZE`, one thread as a Hogwild worker runs, about
:data:`PROBE_SECONDS` per dtype) is done once per machine and kept in the user cache
(``$BIGEMBED_CACHE_DIR``, else ``$XDG_CACHE_HOME/bigembed``, else ``~/.cache/bigembed``), in
``compute_dtype.json``, keyed by the CPU model, its bf16 flags and the torch version; later runs
only read it. A cache that cannot be read is measured again and rewritten (atomically).

``BIGEMBED_COMPUTE_DTYPE=float32`` (or ``bfloat16``) in the environment decides ``auto``
without looking at the machine: for comparisons across machines and for the test suite.
``float32`` and ``bfloat16`` are taken as given. A process resolves a name once
(:func:`choose_compute_dtype` is memoised); the trainer prints :meth:`DtypeChoice.line` among the
run's first lines and records the choice in ``training_stats.json``. bigembed trains on CPU
only, so no GPU enters the decision.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bigembed.atomic import atomic_write_bytes
from bigembed.errors import ConfigError
from bigembed.model.names import COMPUTE_DTYPES

#: bf16 is chosen by ``auto`` only when its products run at least this many times fp32's rate.
BF16_SPEEDUP = 1.5
#: Side of the square products timed (a 512^3 product: about 0.3 s where bf16 is emulated).
PROBE_SIZE = 512
#: Seconds of repeated products per dtype after one warm-up product.
PROBE_SECONDS = 0.2
#: CPU flags that announce bf16 matrix units (x86 ``flags``, Arm ``Features``).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
CACHE_NAME = "compute_dtype.json"
#: The environment variable that decides ``auto`` (float32 or bfloat16) when set.
ENV_OVERRIDE = "BIGEMBED_COMPUTE_DTYPE"


@dataclass(frozen=True)
class DtypeChoice:
    """The resolved compute dtype (a name of ``COMPUTE_DTYPES``), the reason in words, and
    whether the config asked for ``auto``."""

    name: str
    reason: str
    auto: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES.get(self.name)

    def line(self) -> str:
        """What a run prints among its first lines."""
        return f"compute dtype: {self.name} ({self.reason})"


def cpu_info() -> tuple[str, tuple[str, ...] | None]:
    """This CPU's model name and the bf16 flags it announces (None: no ``/proc/cpuinfo``, the
    flags are unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine() or "unknown CPU", None
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return model, tuple(f for f in BF16_FLAGS if f in flags)


def measure_rates(size: int = PROBE_SIZE, seconds: float = PROBE_SECONDS) -> dict[str, float]:
    """GFLOP/s of ``size``-square products in fp32 and bf16 on one thread: one warm-up product
    each, then products for ``seconds`` (at least one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates = {}
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            a = torch.randn(size, size).to(dtype)
            b = torch.randn(size, size).to(dtype)
            torch.mm(a, b)
            reps, start = 0, time.perf_counter()
            while True:
                torch.mm(a, b)
                reps += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    break
            rates[name] = 2 * size**3 * reps / elapsed / 1e9
        return rates
    finally:
        torch.set_num_threads(threads)


def cache_path() -> Path:
    """Where the measured rates of this machine are kept."""
    env = os.environ.get("BIGEMBED_CACHE_DIR")
    if env:
        return Path(env) / CACHE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bigembed" / CACHE_NAME


def _read_cache(path: Path) -> dict[str, dict[str, float]]:
    """The cache's entries; {} when it is absent or not what this module writes."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v
        for k, v in data.items()
        if isinstance(v, dict)
        and all(isinstance(v.get(n), (int, float)) and v[n] > 0 for n in ("float32", "bfloat16"))
    }


def cached_rates(
    key: str, path: Path, measure: Callable[[], dict[str, float]]
) -> tuple[dict[str, float], bool]:
    """The rates of ``key`` from the cache at ``path``, else measured now and written there
    (a cache that cannot be written is only skipped); True when they came from the cache."""
    entries = _read_cache(path)
    if key in entries:
        return entries[key], True
    rates = measure()
    entries[key] = {n: float(rates[n]) for n in ("float32", "bfloat16")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(entries, indent=1, sort_keys=True) + "\n").encode())
    except OSError:
        pass
    return rates, False


def decide_auto(
    model: str,
    flags: tuple[str, ...] | None,
    rates: Callable[[], tuple[dict[str, float], bool]],
) -> DtypeChoice:
    """``auto`` on a CPU named ``model`` announcing the bf16 ``flags`` (None: unknown);
    ``rates()`` gives the measured GFLOP/s and whether they were cached (called only when the
    flags do not already say no)."""
    if flags == ():
        return DtypeChoice("float32", f"auto: no bf16 matrix units on {model}", auto=True)
    measured, cached = rates()
    fp32, bf16 = measured["float32"], measured["bfloat16"]
    units = ", ".join(flags) if flags else "flags unknown"
    how = "cached" if cached else "measured now"
    figures = f"bf16 {bf16:.0f} against fp32 {fp32:.0f} GFLOP/s, {how}"
    if bf16 >= BF16_SPEEDUP * fp32:
        return DtypeChoice("bfloat16", f"auto: {units} on {model}: {figures}", auto=True)
    return DtypeChoice(
        "float32",
        f"auto: {units} on {model}, but bf16 products are not {BF16_SPEEDUP}x faster: {figures}",
        auto=True,
    )


def machine_key(model: str, flags: tuple[str, ...] | None) -> str:
    """What identifies a machine's measurement in the cache."""
    return f"{model} | {','.join(flags) if flags else '?'} | torch {torch.__version__}"


@functools.cache
def choose_compute_dtype(requested: str) -> DtypeChoice:
    """The compute dtype for the config's ``compute_dtype`` (``auto``, ``float32``,
    ``bfloat16``), decided once per process. An unknown name raises the registry's
    ``UnknownName``; an unknown ``BIGEMBED_COMPUTE_DTYPE``, :class:`ConfigError`."""
    if requested != "auto":
        COMPUTE_DTYPES.get(requested)  # unknown names fail here, with the known ones
        return DtypeChoice(requested, "set by compute_dtype")
    forced = os.environ.get(ENV_OVERRIDE)
    if forced:
        if forced not in COMPUTE_DTYPES.names:
            known = " or ".join(COMPUTE_DTYPES.names)
            raise ConfigError(f"{ENV_OVERRIDE}={forced!r}: expected {known}")
        return DtypeChoice(forced, f"auto: set by {ENV_OVERRIDE}={forced}", auto=True)
    model, flags = cpu_info()
    key, path = machine_key(model, flags), cache_path()
    return decide_auto(model, flags, lambda: cached_rates(key, path, measure_rates))
