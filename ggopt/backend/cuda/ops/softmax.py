"""Fused cross-entropy forward and backward: row max, a float64 row reduction of the
exponentials, then one fused pass."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ....tensor import Op, Tensor
from ...array.ops import ce_rows
from ...base import Placement, Step
from ._base import FUSED_COMPILERS

if TYPE_CHECKING:
    from ...array.backend import ArrayBackend

_CE_BACK_SRC = "d = (expf(x - mx) * (float)(1.0 / s) - y) * c"


@functools.cache
def _kernels(cupy: ModuleType) -> tuple[Any, Any, Any]:
    """(sumexp, ce_dot, ce_back), built once per process."""
    ek, rk = cupy.ElementwiseKernel, cupy.ReductionKernel
    # sum of exp(x - max) per row, in double (exps in float, as ggml)
    sumexp = rk("float32 x, float32 mx", "float64 s", "expf(x - mx)", "a + b", "s = a", "0",
                "ggopt_sumexp")
    # sum over everything of y * log_softmax(x), in double
    ce_dot = rk("float32 x, float32 y, float32 mx, float64 lse", "float64 r",
                "(double)y * ((double)(x - mx) - lse)", "a + b", "r = a", "0", "ggopt_ce_dot")
    ce_back = ek("float32 x, float32 y, float32 mx, float64 s, float32 c", "float32 d",
                 _CE_BACK_SRC, "ggopt_ce_back")
    return sumexp, ce_dot, ce_back


@FUSED_COMPILERS.register(Op.CROSS_ENTROPY_LOSS)
def _ce(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    cupy = be.xp
    sumexp, ce_dot, _ = _kernels(cupy)
    a4, b4, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    shape = ce_rows(srcs[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        mx = x.max(axis=1, keepdims=True)
        lse = cupy.log(sumexp(x, mx, axis=1, keepdims=True))
        d[...] = -ce_dot(x, y, mx, lse) / shape[0]

    return step


@FUSED_COMPILERS.register(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    sumexp, _, ce_back = _kernels(be.xp)
    g4, a4, b4 = (mem(s) for s in srcs)
    shape = ce_rows(srcs[1])
    d = mem(node).reshape(shape)
    nrows = np.float32(shape[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        mx = x.max(axis=1, keepdims=True)
        s = sumexp(x, mx, axis=1, keepdims=True)
        ce_back(x, y, mx, s, g4[0, 0, 0, 0] / nrows, d)

    return step
