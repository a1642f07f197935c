"""Compilers from graph nodes to CPU steps, one module per op family (the same families as
:mod:`ggopt.ops` and ``ggopt/_kernels``)."""

from __future__ import annotations

# each family module registers its compilers when imported
from . import conv, elementwise, linalg, optim, reduce, rows, softmax, views  # noqa: F401
from ._base import COMPILERS, Compiler

__all__ = ["COMPILERS", "Compiler"]
