"""Communication strategies for the shared parameters: one class per module, found by name.

``communication.strategy`` selects one (:func:`make_strategy`). A new strategy is a new module
here with a :class:`~bigembed.communication.strategies.base.Strategy` subclass, plus one line
naming it in the config's registry (``bigembed.config.types.STRATEGIES``); nothing else changes.
"""

from __future__ import annotations

from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv
from bigembed.config import STRATEGIES

__all__ = ["SharedTensors", "Strategy", "StrategyEnv", "make_strategy", "strategy_class"]


def strategy_class(name: str) -> type[Strategy]:
    """The strategy called ``name`` (a name of ``STRATEGIES``)."""
    cls: type[Strategy] = STRATEGIES.get(name)
    return cls


def make_strategy(name: str, env: StrategyEnv, shared: SharedTensors) -> Strategy:
    return strategy_class(name)(env, shared)
