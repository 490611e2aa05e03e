"""Registries: the one way a name in a config or on the command line picks an implementation.

A :class:`Registry` pairs each name of one kind (operators, comparators, losses, communication
strategies, precisions, compute dtypes, commands) with a ``"module:attribute"`` target, in the
order the names are documented and listed. The names are known without importing anything, so
validating a config does not load torch; :meth:`Registry.get` imports a name's module the first
time it is asked for. Registering a name twice or a target that is not ``module:attribute`` fails
when the registry is built; ``tests/test_registry.py`` resolves every target of every registry.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownName"]

T = TypeVar("T")


class UnknownName(ValueError):
    """A name that is not registered; the message lists the known ones on one line."""


class Registry(Generic[T]):
    """Names of one ``kind`` and the ``"module:attribute"`` each stands for, in order."""

    def __init__(self, kind: str, entries: Iterable[tuple[str, str]]) -> None:
        self.kind = kind
        self._targets: dict[str, str] = {}
        for name, target in entries:
            if name in self._targets:
                raise ValueError(f"{kind} {name!r} is registered twice")
            module, sep, attribute = target.partition(":")
            if not (sep and module and attribute):
                raise ValueError(f"{kind} {name!r}: {target!r} is not 'module:attribute'")
            self._targets[name] = target

    @property
    def names(self) -> tuple[str, ...]:
        """Every name, in registration order (the config's choices, the order of ``--help``)."""
        return tuple(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def target(self, name: str) -> str:
        """The ``"module:attribute"`` of ``name``."""
        try:
            return self._targets[name]
        except KeyError:
            known = ", ".join(self._targets)
            raise UnknownName(f"unknown {self.kind} {name!r} (known: {known})") from None

    def get(self, name: str) -> T:
        """What ``name`` stands for, importing its module (the first time)."""
        module, _, attribute = self.target(name).partition(":")
        value: Any = getattr(importlib.import_module(module), attribute)
        return value

    def name_of(self, implementation: type) -> str:
        """The name whose target is the class ``implementation`` (its own, not a base's): how
        an implementation knows its name without a second copy of it."""
        return _name_of(self, implementation)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._targets.items())!r})"


@functools.cache
def _name_of(registry: Registry[Any], implementation: type) -> str:
    target = f"{implementation.__module__}:{implementation.__qualname__}"
    for name in registry:
        if registry.target(name) == target:
            return name
    raise UnknownName(f"{implementation.__qualname__} is not a registered {registry.kind}")
