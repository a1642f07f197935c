"""Loading as one transaction: every change is checked when staged and made only at commit.

A loader reads and parses its whole input, then stages each change on a :class:`Staging`:
:meth:`Staging.array` checks an array's shape and type against what it will replace (raising
:class:`~ggopt.errors.ShapeError` / :class:`~ggopt.errors.DTypeError` naming the input and the
field), :meth:`Staging.change` records any other assignment. Nothing is changed until
:meth:`Staging.commit`, which makes every staged change in order. A loader that only assigns
through its staging cannot apply a field before every field is checked. A change may return
its own undo; :meth:`Staging.commit` returns the function that undoes those (a load that
commits in two steps uses it when its second check fails).

Used by checkpoints (:mod:`ggopt.opt.checkpoint`); fits any loader that assigns into existing
objects (model weights, datasets).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import DTypeError, ShapeError, StateError

#: A staged change; it may return the function that undoes it.
Change = Callable[[], "Callable[[], None] | None"]

__all__ = ["Staging"]


class Staging:
    """The checked, not yet made, changes of one load; ``where`` names the input in messages."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._changes: list[Change] = []
        self._committed = False

    def array(self, value: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype,
              label: str, type_name: str | None = None) -> np.ndarray:
        """``value`` checked to be an array of ``shape`` (NumPy order) and ``dtype``.

        ``label`` names the field; shapes are reported in ggml order (``ne``), the type as
        ``type_name`` (e.g. ``"F32"``; default: NumPy's name).
        """
        if value is None:
            raise ShapeError(f"{self.where}: {label} is missing")
        if not isinstance(value, np.ndarray) or value.shape != shape:
            got = getattr(value, "shape", type(value).__name__)
            if isinstance(got, tuple):
                raise ShapeError(f"{self.where}: {label}: expected ggml shape "
                                 f"{list(shape[::-1])}, the file has {list(got[::-1])}")
            raise ShapeError(f"{self.where}: {label}: expected shape {shape}, got {got}")
        if value.dtype != dtype:
            raise DTypeError(f"{self.where}: {label}: expected "
                             f"{type_name or np.dtype(dtype).name}, the file has {value.dtype}")
        return value

    def change(self, apply: Change) -> None:
        """Stage ``apply``: an assignment whose inputs were checked (it must not fail); it may
        return its undo."""
        if self._committed:
            raise StateError(f"{self.where}: this load was already committed")
        self._changes.append(apply)

    def extend(self, other: Staging) -> None:
        """Stage every change of ``other`` (which is then spent)."""
        for apply in other._take():
            self.change(apply)

    def _take(self) -> list[Change]:
        if self._committed:
            raise StateError(f"{self.where}: this load was already committed")
        self._committed = True
        return self._changes

    def commit(self) -> Callable[[], None]:
        """Make every staged change, in the order staged (a staging commits once); return
        the function that undoes the changes that returned an undo, in reverse order."""
        undos = [u for apply in self._take() if (u := apply()) is not None]

        def undo() -> None:
            for u in reversed(undos):
                u()

        return undo
