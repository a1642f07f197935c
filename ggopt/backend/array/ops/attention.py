"""Causal-mask array compilers (diag_mask_inf / diag_mask_zero)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ....ops._base import params_of
from ....ops.attention import DiagMaskParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO)
def _diag_mask_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, n_past = be.xp, params_of(node, DiagMaskParams).n_past
    value = F32(-np.inf) if node.op is Op.DIAG_MASK_INF else F32(0)
    a, d = mem(srcs[0]), mem(node)
    n1, n0 = a.shape[2], a.shape[3]
    masked = xp.arange(n0)[None, :] > n_past + xp.arange(n1)[:, None]

    def step() -> None:
        d[...] = xp.where(masked, value, a)

    return step
