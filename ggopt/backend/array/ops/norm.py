"""Row-normalization array compilers: rms_norm, norm and their gradients, row sums in
float64 as the C kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ....ops._base import params_of
from ....ops.norm import NormParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def _row_sum(xp: Any, x: Any) -> Any:
    """Row sums (last axis) in float64, keepdims."""
    return xp.sum(x, axis=3, keepdims=True, dtype=xp.float64)


def _rms_norm(xp: Any, x: Any, eps: float) -> Any:
    mean = (_row_sum(xp, x * x) / x.shape[3]).astype(xp.float32)
    return x * (F32(1) / xp.sqrt(mean + F32(eps)))


def _norm(xp: Any, x: Any, eps: float) -> Any:
    n = x.shape[3]
    c = x - (_row_sum(xp, x) / n).astype(xp.float32)
    var = (_row_sum(xp, c * c) / n).astype(xp.float32)
    return c * (F32(1) / xp.sqrt(var + F32(eps)))


def _rms_norm_back(xp: Any, g: Any, x: Any, eps: float) -> Any:
    n = x.shape[3]
    sxx, sxg = _row_sum(xp, x * x), _row_sum(xp, x * g)
    r = (F32(1) / xp.sqrt((sxx / n).astype(xp.float32) + F32(eps)))
    c = (-sxg / (sxx + eps * n)).astype(xp.float32)
    return (g + c * x) * r


def _norm_back(xp: Any, g: Any, x: Any, eps: float) -> Any:
    n = x.shape[3]
    c = x - (_row_sum(xp, x) / n).astype(xp.float32)
    var = (_row_sum(xp, c * c) / n).astype(xp.float32)
    r = 1.0 / xp.sqrt((var + F32(eps)).astype(xp.float64))
    mg = _row_sum(xp, g) / n
    mcg = _row_sum(xp, c * g) / n
    return (r.astype(xp.float32) * g + (-mcg * r**3).astype(xp.float32) * c
            + (-r * mg).astype(xp.float32))


_NORM = {Op.RMS_NORM: _rms_norm, Op.NORM: _norm}
_NORM_BACK = {Op.RMS_NORM_BACK: _rms_norm_back, Op.NORM_BACK: _norm_back}


@COMPILERS.register(Op.RMS_NORM, Op.NORM)
def _norm_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, fn, eps = be.xp, _NORM[node.op], params_of(node, NormParams).eps
    a, d = mem(srcs[0]), mem(node)

    def step() -> None:
        d[...] = fn(xp, a, eps)

    return step


@COMPILERS.register(Op.RMS_NORM_BACK, Op.NORM_BACK)
def _norm_back_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, fn, eps = be.xp, _NORM_BACK[node.op], params_of(node, NormParams).eps
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[...] = fn(xp, g, x, eps)

    return step
