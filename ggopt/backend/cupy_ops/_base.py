"""The registry of the CuPy backend's fused-kernel compilers (they replace the array code of
:mod:`..xp_ops` for the ops every training step runs)."""

from __future__ import annotations

from ..._registry import Registry
from ...tensor import Op
from ..xp_ops import Compiler

__all__ = ["FUSED_COMPILERS"]

FUSED_COMPILERS: Registry[Op, Compiler] = Registry("CuPy fused compilers")
