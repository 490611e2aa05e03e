"""Which kernel a training run uses, decided once by the trainer: ``native`` or ``eager``, and why.

The config key ``kernel`` asks for ``auto`` (native where it can run), ``native`` (fail with
one line when it cannot) or ``eager``; ``BIGEMBED_NATIVE=0`` in the environment turns ``auto``
into ``eager``. The trainer calls :func:`choose_kernel` before its Hogwild workers start,
prints :meth:`KernelChoice.line`, records the choice in ``training_stats.json`` and hands the
:class:`KernelChoice` (small and picklable) to the workers, which only load the library it
names (:meth:`KernelChoice.step_kernel`, :meth:`KernelChoice.eval_kernel`) and never decide
again.

``kernel`` names the training step's path. The withheld-edge eval's scoring uses the same
library whenever the choice holds one, even where the step itself is eager (regularisation,
``max_norm`` and dropout do not enter the eval's scores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from bigembed.errors import ConfigError
from bigembed.kernels.native.build import NativeUnavailable, find_or_build, load_library
from bigembed.kernels.native.eval import NativeEval
from bigembed.kernels.native.step import NativeStep, unsupported
from bigembed.model import NegativeSettings, ScoringModel

KernelName = Literal["native", "eager"]


@dataclass(frozen=True)
class KernelChoice:
    """The run's kernel (``native`` or ``eager``), the reason in words, and the built library
    the workers load (None: nothing native runs)."""

    kernel: KernelName
    reason: str
    library: str | None = None
    #: True when the reason is a missing or broken build: the one warning of the run.
    degraded: bool = False

    def line(self) -> str:
        """What the run prints among its first lines."""
        return f"kernel: {self.kernel} ({self.reason})"

    def step_kernel(self, model: ScoringModel, negs: NegativeSettings) -> NativeStep | None:
        """The native step bound to this model, or None on the eager path."""
        if self.kernel != "native" or self.library is None:
            return None
        return NativeStep.for_model(model, negs, load_library(self.library))

    def eval_kernel(self, model: ScoringModel, negs: NegativeSettings) -> NativeEval | None:
        """The native eval scoring bound to this model, or None (eager eval)."""
        if self.library is None:
            return None
        return NativeEval.for_model(model, negs, load_library(self.library))


EAGER = KernelChoice("eager", "no native kernel asked for")


def choose_kernel(requested: str, model: ScoringModel, negs: NegativeSettings) -> KernelChoice:
    """The kernel for a run of ``model`` with training negatives ``negs``; ``requested`` is the
    config's ``kernel``. Builds the library now (into the user cache) when none is built yet.

    Raises :class:`~bigembed.errors.ConfigError` when ``kernel: native`` cannot be honoured.
    """
    if requested == "eager":
        return KernelChoice("eager", "forced by kernel: eager")
    if requested == "auto" and os.environ.get("BIGEMBED_NATIVE", "1") == "0":
        return KernelChoice("eager", "turned off by BIGEMBED_NATIVE=0")
    try:
        path = str(find_or_build())
        load_library(path)
    except NativeUnavailable as exc:
        if requested == "native":
            raise ConfigError(
                f"kernel: native, but the native kernel is unavailable: {exc}"
            ) from None
        return KernelChoice("eager", str(exc), degraded=True)
    why_not = unsupported(model, negs)
    if why_not is None:
        return KernelChoice("native", f"built at {path}", path)
    if requested == "native":
        raise ConfigError(f"kernel: native, but {why_not}")
    return KernelChoice("eager", why_not, path)
