"""Communication strategies for the shared parameters: one class per module, found by name.

``communication.strategy`` selects one (:func:`make_strategy`). A new strategy is a new module
here with a :class:`~bigembed.communication.strategies.base.Strategy` subclass, plus its name in
the config's list of choices (``bigembed.config.types.STRATEGY_NAMES``); nothing else changes.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv

__all__ = ["SharedTensors", "Strategy", "StrategyEnv", "make_strategy", "strategy_classes"]


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def strategy_classes() -> dict[str, type[Strategy]]:
    """Every strategy of this package, by its config name."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return {
        c.name: c
        for c in _subclasses(Strategy)
        if issubclass(c, Strategy) and not inspect.isabstract(c)
    }


def make_strategy(name: str, env: StrategyEnv, shared: SharedTensors) -> Strategy:
    classes = strategy_classes()
    if name not in classes:
        raise ValueError(f"unknown communication strategy {name!r} (one of {', '.join(classes)})")
    return classes[name](env, shared)
