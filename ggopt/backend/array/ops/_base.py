"""The array compilers' registry and the stride algebra they share.

Each compiler binds the arrays of a node and of its sources once and returns a zero-argument
step that writes the node's array in place, with ``xp`` array code (NumPy or CuPy). The
semantics are ggml's, as in the CPU backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...._registry import Registry
from ....tensor import Op, Tensor
from ...base import Placement, Step

if TYPE_CHECKING:
    from ..backend import ArrayBackend

__all__ = ["COMPILERS", "Compiler", "F32", "Srcs", "split_axes", "tile_split"]

F32 = np.float32
Srcs = tuple[Tensor, ...]
Compiler = Callable[["ArrayBackend", Tensor, Srcs, Placement], Step]
COMPILERS: Registry[Op, Compiler] = Registry("array compilers")


def split_axes(xp: Any, arr: Any, groups: Sequence[tuple[int, ...]]) -> Any:
    """A view of ``arr`` whose axis ``i`` is split into the sizes ``groups[i]`` (outer first).

    The sizes of a group multiply to the axis length (size-1 entries may be inserted), so the
    result is always a view of the same memory, never a copy.
    """
    shape: list[int] = []
    strides: list[int] = []
    for sizes, stride in zip(groups, arr.strides):
        inner = []
        for n in reversed(sizes):
            inner.append(stride)
            stride *= n
        shape += sizes
        strides += reversed(inner)
    return xp.lib.stride_tricks.as_strided(arr, tuple(shape), tuple(strides))


def tile_split(big: Sequence[int], small: Sequence[int]
               ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Axis groups that turn ggml's tiling of shape ``small`` over ``big`` into broadcasting.

    An axis where ``small`` is neither 1 nor the full length is split into ``(tiles, length)``
    for ``big`` and ``(1, length)`` for ``small``: element ``i`` of ``big`` reads ``i % length``.
    """
    gbig: list[tuple[int, ...]] = []
    gsmall: list[tuple[int, ...]] = []
    for n_big, n_small in zip(big, small):
        if n_small in (n_big, 1):
            gbig.append((n_big,))
            gsmall.append((n_small,))
        else:
            gbig.append((n_big // n_small, n_small))
            gsmall.append((1, n_small))
    return gbig, gsmall

