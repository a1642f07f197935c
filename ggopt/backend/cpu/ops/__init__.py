"""Compilers from graph nodes to CPU steps, one module per op family (the same families as
:mod:`ggopt.ops` and ``ggopt/_kernels``)."""

from __future__ import annotations

# each family module registers its compilers when imported
from . import (  # noqa: F401
    attention,
    conv,
    elementwise,
    linalg,
    norm,
    optim,
    pointwise,
    reduce,
    rope,
    rows,
    softmax,
    views,
)
from ._base import COMPILERS, Compiler

__all__ = ["COMPILERS", "Compiler"]
