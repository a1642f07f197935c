"""The CPU compilers' registry: each binds a node's arrays once and returns a zero-argument
step that runs one kernel (or a BLAS product) on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...._registry import Registry
from ....tensor import Op, Tensor
from ...base import Placement, Step

if TYPE_CHECKING:
    from ..backend import CPUBackend

__all__ = ["COMPILERS", "Compiler", "Srcs"]

Srcs = tuple[Tensor, ...]
Compiler = Callable[["CPUBackend", Tensor, Srcs, Placement], Step]
COMPILERS: Registry[Op, Compiler] = Registry("CPU compilers")


def unit_rows(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy of it, with a unit stride along its rows (the last axis), as the kernels
    that take rows need."""
    if a.shape[-1] <= 1 or a.strides[-1] == a.itemsize:
        return a
    return np.ascontiguousarray(a)
