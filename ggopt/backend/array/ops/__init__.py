"""Compilers from graph nodes to steps written with an array module ``xp`` (NumPy or CuPy), one
module per op family (the same families as :mod:`ggopt.ops`)."""

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
from ._base import COMPILERS, Compiler, split_axes, tile_split
from .elementwise import UNARY, UNARY_BACK, check_unary_back
from .softmax import ce_rows

__all__ = [
    "COMPILERS", "Compiler", "UNARY", "UNARY_BACK", "ce_rows", "check_unary_back", "split_axes",
    "tile_split",
]
