"""The one registry type: a table from keys (graph ops) to functions, filled by a decorator.

Op modules register backward rules in one, each backend registers its compilers in another;
all are :class:`Registry` objects, so ``op in table``, ``table[op]`` and ``set(table)`` read the
same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Registry"]

K = TypeVar("K", bound=Hashable)
F = TypeVar("F", bound=Callable[..., object])


class Registry(dict[K, F], Generic[K, F]):
    """A dict from keys to functions; :meth:`register` fills it as a decorator.

    ``name`` says what the table holds (for error messages).
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def register(self, *keys: K) -> Callable[[F], F]:
        """A decorator that enters the decorated function under every key in ``keys``."""

        def enter(fn: F) -> F:
            for key in keys:
                if key in self:
                    raise KeyError(f"{self.name}: {key!r} is registered twice")
                self[key] = fn
            return fn

        return enter

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self)} entries)"
