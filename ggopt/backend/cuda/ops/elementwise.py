"""Fused element-wise kernels: the unary functions and their derivatives, one pass each, with
the scalar functions of ``_kernels/scalar_math.h``."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ....ops._base import params_of
from ....tensor import Op, Tensor, UnaryOp
from ...array.ops import check_unary_back
from ...base import Placement, Step
from ._base import FUSED_COMPILERS, preamble

if TYPE_CHECKING:
    from ...array.backend import ArrayBackend

#: y = f(x), with the functions of ``_kernels/scalar_math.h``
_UNARY_SRC = {
    UnaryOp.NEG: "y = -x",
    UnaryOp.EXP: "y = expf(x)",
    UnaryOp.ABS: "y = fabsf(x)",
    UnaryOp.TANH: "y = tanhf(x)",
    UnaryOp.RELU: "y = ggopt_relu(x)",
    UnaryOp.STEP: "y = ggopt_step(x)",
    UnaryOp.SIGMOID: "y = ggopt_sigmoidf(x)",
    UnaryOp.SILU: "y = ggopt_silu(x)",
    UnaryOp.GELU: "y = ggopt_gelu(x)",
}

#: y = g * f'(x)
_UNARY_BACK_SRC = {
    UnaryOp.NEG: "y = -g",
    UnaryOp.EXP: "y = g * expf(x)",
    UnaryOp.ABS: "y = g * ggopt_sgn(x)",
    UnaryOp.TANH: "y = g * ggopt_tanh_d(x)",
    UnaryOp.RELU: "y = g * ggopt_step(x)",
    UnaryOp.SIGMOID: "y = g * ggopt_sigmoid_d(x)",
    UnaryOp.SILU: "y = g * ggopt_silu_d(x)",
    UnaryOp.GELU: "y = g * ggopt_gelu_d(x)",
}


@functools.cache
def _kernels(cupy: ModuleType) -> tuple[dict[UnaryOp, Any], dict[UnaryOp, Any]]:
    """(forward, backward) kernel per unary function, built once per process."""
    ek = cupy.ElementwiseKernel
    fwd = {u: ek("float32 x", "float32 y", src, f"ggopt_{u.value}", preamble=preamble())
           for u, src in _UNARY_SRC.items()}
    back = {u: ek("float32 x, float32 g", "float32 y", src, f"ggopt_{u.value}_back",
                  preamble=preamble()) for u, src in _UNARY_BACK_SRC.items()}
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
