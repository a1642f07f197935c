"""Row-gather compilers (kernels: ``_kernels/_get_rows.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._get_rows as _get_rows

from ....tensor import Op, Tensor
from ...base import Placement, Step, check_row_indices
from . import lowp, quant
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.GET_ROWS)
def _get_rows_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if srcs[0].type.is_quantized:
        return quant.get_rows_step(be, node, srcs, mem)
    if srcs[0].type.is_lowp:
        return lowp.get_rows_step(be, node, srcs, mem)
    a, idx, d = mem(srcs[0]), mem(srcs[1])[0], mem(node)

    def step() -> None:
        check_row_indices("get_rows", idx, a.shape[2])
        _get_rows.get_rows(a, idx, d, be.n_threads)

    return step


@COMPILERS.register(Op.GET_ROWS_BACK)
def _get_rows_back_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, idx, d = mem(srcs[0])[0, 0], mem(srcs[1])[0, 0, 0], mem(node)[0, 0]

    def step() -> None:
        check_row_indices("get_rows_back", idx, d.shape[0])
        _get_rows.get_rows_back(g, idx, d, be.n_threads)

    return step
