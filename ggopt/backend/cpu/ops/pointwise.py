"""swiglu, sin, cos and add1 compilers (kernels: ``_kernels/_pointwise.pyx``, add1 the
element-wise add of ``_kernels/_elementwise.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._elementwise as ew
import ggopt._kernels._pointwise as _pointwise

from ....ops._base import params_of
from ....ops.order import in_ggml_order
from ....ops.pointwise import GluParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from . import ggml_order
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.GLU)
def _glu_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if len(srcs) == 2 and in_ggml_order(node):
        return ggml_order.swiglu_step(be, node, srcs, mem)
    d = mem(node)
    if len(srcs) == 2:
        x, u = mem(srcs[0]), mem(srcs[1])
    else:
        a, n = mem(srcs[0]), node.ne[0]
        x, u = a[..., :n], a[..., n:]
        if params_of(node, GluParams).swapped:
            x, u = u, x
    return lambda: _pointwise.swiglu(x, u, d, be.n_threads)


@COMPILERS.register(Op.SIN, Op.COS)
def _trig_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    kernel = _pointwise.sin if node.op is Op.SIN else _pointwise.cos
    a, d = mem(srcs[0]), mem(node)
    return lambda: kernel(a, d, be.n_threads)


@COMPILERS.register(Op.ADD1)
def _add1_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: ew.binary(ew.BIN_ADD, a, b, d, be.n_threads)
