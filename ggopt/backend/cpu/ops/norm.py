"""Row-normalization compilers (kernels: ``_kernels/_norm.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._norm as _norm

from ....ops._base import params_of
from ....ops.norm import NormParams
from ....ops.order import in_ggml_order
from ....tensor import Op, Tensor
from ...base import Placement, Step
from . import ggml_order
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


_NORM = {Op.RMS_NORM: _norm.rms_norm, Op.NORM: _norm.norm}
_NORM_BACK = {Op.RMS_NORM_BACK: _norm.rms_norm_back, Op.NORM_BACK: _norm.norm_back}


@COMPILERS.register(Op.RMS_NORM, Op.NORM)
def _norm_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if node.op is Op.RMS_NORM and in_ggml_order(node):
        return ggml_order.rms_norm_step(be, node, srcs, mem)
    kernel, eps = _NORM[node.op], params_of(node, NormParams).eps
    a, d = mem(srcs[0]), mem(node)
    return lambda: kernel(a, d, eps, be.n_threads)


@COMPILERS.register(Op.RMS_NORM_BACK, Op.NORM_BACK)
def _norm_back_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    kernel, eps = _NORM_BACK[node.op], params_of(node, NormParams).eps
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: kernel(g, x, d, eps, be.n_threads)
