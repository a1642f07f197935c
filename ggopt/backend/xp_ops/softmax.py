"""Softmax and cross-entropy array compilers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ops._base import params_of
from ...ops.softmax import SoftMaxParams
from ...tensor import Op, Tensor
from ..base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..xp import ArrayBackend


@COMPILERS.register(Op.SOFT_MAX)
def _soft_max(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, d = mem(srcs[0]), mem(node)
    s = F32(params_of(node, SoftMaxParams).scale)

    def step() -> None:
        x = a if s == 1 else a * s
        e = xp.exp(x - x.max(axis=3, keepdims=True))
        total = xp.sum(e, axis=3, keepdims=True, dtype=xp.float64)
        d[...] = e * (1.0 / total).astype(xp.float32)

    return step


@COMPILERS.register(Op.SOFT_MAX_BACK)
def _soft_max_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    g, y, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        dot = xp.sum(g * y, axis=3, keepdims=True, dtype=xp.float64).astype(xp.float32)
        d[...] = (g - dot) * y

    return step


def ce_rows(t: Tensor) -> tuple[int, int]:
    """(rows, classes) of a cross-entropy operand: rows run along ne1..ne3."""
    return t.nrows(), t.ne[0]


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS)
def _ce(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a4, b4, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    shape = ce_rows(srcs[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        sh = x - x.max(axis=1, keepdims=True)
        lse = xp.log(xp.sum(xp.exp(sh), axis=1, keepdims=True, dtype=xp.float64))
        d[...] = -xp.sum(y * (sh - lse)) / shape[0]

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    g4, a4, b4 = (mem(s) for s in srcs)
    shape = ce_rows(srcs[1])
    d = mem(node).reshape(shape)
    nrows = F32(shape[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        inv = (1.0 / xp.sum(e, axis=1, keepdims=True, dtype=xp.float64)).astype(xp.float32)
        d[...] = (e * inv - y) * (g4[0, 0, 0, 0] / nrows)

    return step
