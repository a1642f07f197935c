"""Row-gather array compilers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....tensor import Op, Tensor
from ...base import Placement, Step, check_row_indices
from ._base import COMPILERS, Srcs
from .lowp import widened
from .quant import dequantized

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.GET_ROWS)
def _get_rows(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    a, idx, d = mem(srcs[0]), mem(srcs[1])[0], mem(node)
    if srcs[0].type.is_quantized or srcs[0].type.is_lowp:
        raw, qt = a, srcs[0]

        def quantized_step() -> None:
            check_row_indices("get_rows", idx, raw.shape[2])
            rows = widened(be, qt.type, raw) if qt.type.is_lowp else dequantized(be, qt, raw)
            for i3 in range(d.shape[0]):
                for i2 in range(d.shape[1]):
                    xp.take(rows[i3, i2], idx[i3, i2], axis=0, out=d[i3, i2])

        return quantized_step
    pairs = [(a[i3, i2], idx[i3, i2], d[i3, i2])
             for i3 in range(d.shape[0]) for i2 in range(d.shape[1])]

    def step() -> None:
        check_row_indices("get_rows", idx, a.shape[2])
        for rows, ind, out in pairs:
            xp.take(rows, ind, axis=0, out=out)

    return step


@COMPILERS.register(Op.GET_ROWS_BACK)
def _get_rows_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, idx, d = mem(srcs[0])[0, 0], mem(srcs[1])[0, 0, 0], mem(node)[0, 0]

    def step() -> None:
        check_row_indices("get_rows_back", idx, d.shape[0])
        d[...] = 0
        be.scatter_add(d, idx, g)

    return step
