"""Fused element-wise kernels: the unary functions and their derivatives, one pass each."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ...ops._base import params_of
from ...tensor import Op, Tensor, UnaryOp
from ..base import Placement, Step
from ..xp_ops import check_unary_back
from ._base import FUSED_COMPILERS

if TYPE_CHECKING:
    from ..xp import ArrayBackend

_PREAMBLE = r"""
__device__ __forceinline__ float ggopt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* the argument of tanh in ggml's GELU: sqrt(2/pi) * x * (1 + 0.044715 x^2) */
__device__ __forceinline__ float ggopt_gelu_u(float x) {
    return 0.7978845608f * x * (1.0f + 0.044715f * x * x);
}
"""

#: y = f(x); GELU as x*sigmoid(2u) == 0.5x(1 + tanh u), without cancellation for x << 0
_UNARY_SRC = {
    UnaryOp.NEG: "y = -x",
    UnaryOp.EXP: "y = expf(x)",
    UnaryOp.ABS: "y = fabsf(x)",
    UnaryOp.TANH: "y = tanhf(x)",
    UnaryOp.RELU: "y = x > 0.0f ? x : 0.0f",
    UnaryOp.STEP: "y = x > 0.0f ? 1.0f : 0.0f",
    UnaryOp.SIGMOID: "y = ggopt_sigmoid(x)",
    UnaryOp.SILU: "y = x * ggopt_sigmoid(x)",
    UnaryOp.GELU: "y = x * ggopt_sigmoid(2.0f * ggopt_gelu_u(x))",
}

#: y = g * f'(x)
_UNARY_BACK_SRC = {
    UnaryOp.NEG: "y = -g",
    UnaryOp.EXP: "y = g * expf(x)",
    UnaryOp.ABS: "y = g * (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))",
    UnaryOp.TANH: "const float t = tanhf(x); y = g * (1.0f - t * t)",
    UnaryOp.RELU: "y = x > 0.0f ? g : 0.0f",
    UnaryOp.SIGMOID: "const float t = ggopt_sigmoid(x); y = g * (t * (1.0f - t))",
    UnaryOp.SILU: "const float t = ggopt_sigmoid(x); y = g * (t * (1.0f + x * (1.0f - t)))",
    UnaryOp.GELU: (
        "const float s = ggopt_sigmoid(2.0f * ggopt_gelu_u(x));"
        " const float du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);"
        " y = g * (s + 2.0f * x * s * (1.0f - s) * du)"
    ),
}


@functools.cache
def _kernels(cupy: ModuleType) -> tuple[dict[UnaryOp, Any], dict[UnaryOp, Any]]:
    """(forward, backward) kernel per unary function, built once per process."""
    ek = cupy.ElementwiseKernel
    fwd = {u: ek("float32 x", "float32 y", src, f"ggopt_{u.value}", preamble=_PREAMBLE)
           for u, src in _UNARY_SRC.items()}
    back = {u: ek("float32 x, float32 g", "float32 y", src, f"ggopt_{u.value}_back",
                  preamble=_PREAMBLE) for u, src in _UNARY_BACK_SRC.items()}
    return fwd, back


@FUSED_COMPILERS.register(Op.UNARY)
def _unary(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    fn = _kernels(be.xp)[0][params_of(node, UnaryOp)]
    a, d = mem(srcs[0]), mem(node)
    return lambda: fn(a, d)


@FUSED_COMPILERS.register(Op.UNARY_BACK)
def _unary_back(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    check_unary_back(node)
    fn = _kernels(be.xp)[1][params_of(node, UnaryOp)]
    x, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: fn(x, g, d)
