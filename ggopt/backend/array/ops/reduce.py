"""Reduction, tiling and integer array compilers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs, split_axes, tile_split

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.SUM)
def _sum(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, d = mem(srcs[0]), mem(node)

    def step() -> None:
        d[...] = xp.sum(a, dtype=xp.float64)

    return step


@COMPILERS.register(Op.SUM_ROWS, Op.MEAN)
def _sum_rows(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, d = mem(srcs[0]), mem(node)
    inv = F32(1.0 / a.shape[3]) if a.shape[3] else F32(np.nan)
    mean = node.op is Op.MEAN

    def step() -> None:
        d[...] = xp.sum(a, axis=3, keepdims=True, dtype=xp.float64)
        if mean:
            xp.multiply(d, inv, out=d)

    return step


@COMPILERS.register(Op.REPEAT)
def _repeat(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    gd, ga = tile_split(d.shape, a.shape)
    a, d = split_axes(be.xp, a, ga), split_axes(be.xp, d, gd)

    def step() -> None:
        d[...] = a

    return step


@COMPILERS.register(Op.REPEAT_BACK)
def _repeat_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, d = mem(srcs[0]), mem(node)
    ga, gd = tile_split(a.shape, d.shape)
    a, d = split_axes(xp, a, ga), split_axes(xp, d, gd)
    axes = tuple(i for i, (n, m) in enumerate(zip(a.shape, d.shape)) if m == 1 and n != 1)

    def step() -> None:
        d[...] = xp.sum(a, axis=axes, keepdims=True, dtype=xp.float64)

    return step


@COMPILERS.register(Op.ARGMAX)
def _argmax(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, d = mem(srcs[0])[0, 0], mem(node)[0, 0, 0]
    last = a.shape[1] - 1

    def step() -> None:
        d[...] = last - xp.argmax(a[:, ::-1], axis=1)  # ggml keeps the last maximum

    return step


@COMPILERS.register(Op.COUNT_EQUAL)
def _count_equal(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[...] = xp.sum(a == b, dtype=xp.int64)

    return step
