"""Reduction, tiling and integer compilers (kernels: ``_kernels/_reduce.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._elementwise as ew
import ggopt._kernels._reduce as _reduce

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.SUM)
def _sum(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)

    def step() -> None:
        d[0, 0, 0, 0] = _reduce.sum_all(a, be.n_threads)

    return step


@COMPILERS.register(Op.SUM_ROWS, Op.MEAN)
def _sum_rows(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    if node.op is Op.SUM_ROWS:
        return lambda: _reduce.sum_rows(a, d, be.n_threads)
    inv = 1.0 / a.shape[3] if a.shape[3] else float("nan")

    def step() -> None:
        _reduce.sum_rows(a, d, be.n_threads)
        ew.scale(d, d, inv, 0.0, be.n_threads)

    return step


@COMPILERS.register(Op.REPEAT)
def _repeat(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    return lambda: _reduce.repeat(a, d, be.n_threads)


@COMPILERS.register(Op.REPEAT_BACK)
def _repeat_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    if a.size == 0:  # a sum over no tiles
        return lambda: d.fill(0.0)
    return lambda: _reduce.repeat_back(a, d, be.n_threads)


@COMPILERS.register(Op.ARGMAX)
def _argmax(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0])[0, 0], mem(node)[0, 0, 0]
    return lambda: _reduce.argmax(a, d, be.n_threads)


@COMPILERS.register(Op.COUNT_EQUAL)
def _count_equal(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[0, 0, 0, 0] = _reduce.count_equal(a, b, be.n_threads)

    return step
