"""The CPU compilers' registry: each binds a node's arrays once and returns a zero-argument
step that runs one kernel (or a BLAS product) on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...._registry import Registry
from ....tensor import Op, Tensor
from ...base import Placement, Step

if TYPE_CHECKING:
    from ..backend import CPUBackend

__all__ = ["COMPILERS", "Compiler", "Srcs"]

Srcs = tuple[Tensor, ...]
Compiler = Callable[["CPUBackend", Tensor, Srcs, Placement], Step]
COMPILERS: Registry[Op, Compiler] = Registry("CPU compilers")
