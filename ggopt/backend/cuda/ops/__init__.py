"""Fused CUDA kernels for the CuPy backend, one module per op family (the families of
:mod:`ggopt.ops` that have fused kernels). Importing this package never imports CuPy: each
module builds its kernels from the backend's ``xp`` module on first use."""

from __future__ import annotations

# each family module registers its compilers when imported
from . import elementwise, optim, softmax  # noqa: F401
from ._base import FUSED_COMPILERS

__all__ = ["FUSED_COMPILERS"]
