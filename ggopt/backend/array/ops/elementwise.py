"""Element-wise array compilers, with the unary functions and their derivatives as ``xp``
expressions (the independent reference for the C kernels' ``scalar_math.h``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ....errors import InvalidValueError
from ....ops._base import params_of
from ....ops.elementwise import ScaleParams
from ....tensor import Op, Tensor, UnaryOp
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs, split_axes, tile_split

if TYPE_CHECKING:
    from ..backend import ArrayBackend


GELU_K = F32(0.7978845608028654)  # sqrt(2/pi), ggml's tanh-approximated GELU
GELU_A = F32(0.044715)


@COMPILERS.register(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    fn = {Op.ADD: xp.add, Op.SUB: xp.subtract, Op.MUL: xp.multiply, Op.DIV: xp.divide}[node.op]
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    ga, gb = tile_split(a.shape, b.shape)
    a, b, d = split_axes(xp, a, ga), split_axes(xp, b, gb), split_axes(xp, d, ga)
    return lambda: fn(a, b, out=d)


@COMPILERS.register(Op.SCALE)
def _scale(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    p = params_of(node, ScaleParams)
    s, bias = F32(p.s), F32(p.bias)
    a, d = mem(srcs[0]), mem(node)
    if bias == 0:
        return lambda: xp.multiply(a, s, out=d)

    def step() -> None:
        xp.multiply(a, s, out=d)
        xp.add(d, bias, out=d)

    return step


@COMPILERS.register(Op.SQR, Op.SQRT, Op.LOG)
def _simple(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    fn = {Op.SQR: be.xp.square, Op.SQRT: be.xp.sqrt, Op.LOG: be.xp.log}[node.op]
    a, d = mem(srcs[0]), mem(node)
    return lambda: fn(a, out=d)


def _sigmoid(xp: Any, x: Any) -> Any:
    return F32(1) / (F32(1) + xp.exp(-x))


def _gelu_u(x: Any) -> Any:
    return GELU_K * x * (F32(1) + GELU_A * x * x)


def _gelu_back(xp: Any, x: Any, g: Any) -> Any:
    # d/dx x*sigmoid(2u) = s + 2*x*s*(1 - s)*u' with s = sigmoid(2u)
    s = _sigmoid(xp, F32(2) * _gelu_u(x))
    du = GELU_K * (F32(1) + F32(3) * GELU_A * x * x)
    return g * (s + F32(2) * x * s * (F32(1) - s) * du)


def _silu_back(xp: Any, x: Any, g: Any) -> Any:
    t = _sigmoid(xp, x)
    return g * (t * (F32(1) + x * (F32(1) - t)))


def _sigmoid_back(xp: Any, x: Any, g: Any) -> Any:
    t = _sigmoid(xp, x)
    return g * (t * (F32(1) - t))


def _tanh_back(xp: Any, x: Any, g: Any) -> Any:
    t = xp.tanh(x)
    return g * (F32(1) - t * t)


#: f(x) per unary function, as ``xp`` array expressions in float32.
UNARY: dict[UnaryOp, Callable[[Any, Any], Any]] = {
    UnaryOp.NEG: lambda xp, x: -x,
    UnaryOp.EXP: lambda xp, x: xp.exp(x),
    UnaryOp.ABS: lambda xp, x: xp.abs(x),
    UnaryOp.TANH: lambda xp, x: xp.tanh(x),
    UnaryOp.RELU: lambda xp, x: xp.where(x > 0, x, F32(0)),
    UnaryOp.STEP: lambda xp, x: (x > 0).astype(xp.float32),
    UnaryOp.SIGMOID: _sigmoid,
    UnaryOp.SILU: lambda xp, x: x * _sigmoid(xp, x),
    UnaryOp.GELU: lambda xp, x: x * _sigmoid(xp, F32(2) * _gelu_u(x)),  # == 0.5x(1 + tanh u)
}

#: g * f'(x) per unary function (STEP has no derivative).
UNARY_BACK: dict[UnaryOp, Callable[[Any, Any, Any], Any]] = {
    UnaryOp.NEG: lambda xp, x, g: -g,
    UnaryOp.EXP: lambda xp, x, g: g * xp.exp(x),
    UnaryOp.ABS: lambda xp, x, g: g * xp.sign(x),
    UnaryOp.TANH: _tanh_back,
    UnaryOp.RELU: lambda xp, x, g: xp.where(x > 0, g, F32(0)),
    UnaryOp.SIGMOID: _sigmoid_back,
    UnaryOp.SILU: _silu_back,
    UnaryOp.GELU: _gelu_back,
}


@COMPILERS.register(Op.UNARY)
def _unary(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, fn = be.xp, UNARY[params_of(node, UnaryOp)]
    a, d = mem(srcs[0]), mem(node)

    def step() -> None:
        d[...] = fn(xp, a)

    return step


def check_unary_back(node: Tensor) -> None:
    """Raise for unary_back of a function without a derivative (STEP)."""
    uop = params_of(node, UnaryOp)
    if uop not in UNARY_BACK:
        raise InvalidValueError(f"unary_back: {uop.name} has no backward pass; expected one "
                         f"of {', '.join(u.name for u in UNARY_BACK)}")


@COMPILERS.register(Op.UNARY_BACK)
def _unary_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    check_unary_back(node)
    xp, fn = be.xp, UNARY_BACK[params_of(node, UnaryOp)]
    x, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[...] = fn(xp, x, g)

    return step
