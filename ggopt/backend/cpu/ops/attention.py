"""Causal-mask compilers (kernel: ``_kernels/_attention.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._attention as _attn

from ....ops._base import params_of
from ....ops.attention import DiagMaskParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO)
def _diag_mask_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    n_past = params_of(node, DiagMaskParams).n_past
    value = float("-inf") if node.op is Op.DIAG_MASK_INF else 0.0
    a, d = mem(srcs[0]), mem(node)
    return lambda: _attn.diag_mask(a, d, n_past, value, be.n_threads)
