"""Element-wise ops: binary with tiling, scale, sqr/sqrt/log and the unary functions.

Kernels: :mod:`ggopt._kernels._elementwise`; compilers: ``backend/*_ops/elementwise.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor, UnaryOp
from ..types import F32
from ._base import (
    GradSink,
    as_scalar,
    backward,
    can_repeat,
    check_ctx,
    check_f32,
    ignore_sources,
    ne_str,
    params_of,
    unary_f32,
)

__all__ = [
    "ScaleParams", "add", "add_inplace", "sub", "mul", "div", "scale", "scale_inplace", "sqr",
    "sqrt", "log", "neg", "exp", "abs", "relu", "gelu", "silu", "tanh", "sigmoid", "step",
]


@dataclass(frozen=True, slots=True)
class ScaleParams:
    """``Op.SCALE``: the result is ``s * a + bias``."""

    s: float
    bias: float


def _binary(fn: str, op: Op, ctx: Context, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a, b=b)
    if not can_repeat(b, a):
        raise ShapeError(f"ggml_{fn}: b {ne_str(b)} does not tile a {ne_str(a)} "
                         "(every a.ne[i] must be a multiple of b.ne[i])")
    if inplace:
        return ctx.new_view(a, a.ne, a.nb, 0, op, (a, b))
    return ctx.new_op(F32, a.ne, op, (a, b))


def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` with ``b`` tiled over ``a`` (ggml_add)."""
    return _binary("add", Op.ADD, ctx, a, b, False)


def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a += b``: the result is a view of ``a`` (ggml_add_inplace)."""
    return _binary("add_inplace", Op.ADD, ctx, a, b, True)


def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a - b`` with ``b`` tiled over ``a`` (ggml_sub)."""
    return _binary("sub", Op.SUB, ctx, a, b, False)


def _sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary("sub_inplace", Op.SUB, ctx, a, b, True)


def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a * b`` element-wise with ``b`` tiled over ``a`` (ggml_mul)."""
    return _binary("mul", Op.MUL, ctx, a, b, False)


def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` element-wise with ``b`` tiled over ``a`` (ggml_div)."""
    return _binary("div", Op.DIV, ctx, a, b, False)


@backward(Op.ADD)
def _add_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        sink.add(1, sink.untile(1, g))


@backward(Op.SUB)
def _sub_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        sink.sub(1, sink.untile(1, g))


@backward(Op.MUL)
def _mul_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        sink.add(0, mul(ctx, g, b))
    if sink.needs(1):
        sink.add(1, sink.untile(1, mul(ctx, a, g)))


@backward(Op.DIV)
def _div_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    b = node.src[1]
    if sink.needs(0):
        sink.add(0, div(ctx, g, b))
    if sink.needs(1):
        sink.sub(1, sink.untile(1, mul(ctx, g, div(ctx, node, b))))


def _scale(fn: str, ctx: Context, a: Tensor, s: float, inplace: bool) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    s = as_scalar(fn, "s", s)
    if inplace:
        return ctx.new_view(a, a.ne, a.nb, 0, Op.SCALE, (a,), ScaleParams(s, 0.0))
    return ctx.new_op(F32, a.ne, Op.SCALE, (a,), ScaleParams(s, 0.0))


def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``s * a`` (ggml_scale)."""
    return _scale("scale", ctx, a, s, False)


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``a *= s``: the result is a view of ``a`` (ggml_scale_inplace)."""
    return _scale("scale_inplace", ctx, a, s, True)


@backward(Op.SCALE)
def _scale_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, g, params_of(node, ScaleParams).s))


def sqr(ctx: Context, a: Tensor) -> Tensor:
    """``a * a`` (ggml_sqr)."""
    return unary_f32("sqr", Op.SQR, ctx, a)


def sqrt(ctx: Context, a: Tensor) -> Tensor:
    """``sqrt(a)`` (ggml_sqrt)."""
    return unary_f32("sqrt", Op.SQRT, ctx, a)


def log(ctx: Context, a: Tensor) -> Tensor:
    """``log(a)`` (ggml_log)."""
    return unary_f32("log", Op.LOG, ctx, a)


@backward(Op.SQR)
def _sqr_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, mul(ctx, node.src[0], g), 2.0))


@backward(Op.SQRT)
def _sqrt_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, scale(ctx, div(ctx, g, node), 0.5))


@backward(Op.LOG)
def _log_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, div(ctx, g, node.src[0]))


def _unary(fn: str, uop: UnaryOp, ctx: Context, a: Tensor) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    return ctx.new_op(F32, a.ne, Op.UNARY, (a,), uop)


def neg(ctx: Context, a: Tensor) -> Tensor:
    """``-a`` (ggml_neg)."""
    return _unary("neg", UnaryOp.NEG, ctx, a)


def exp(ctx: Context, a: Tensor) -> Tensor:
    """``exp(a)`` (ggml_exp)."""
    return _unary("exp", UnaryOp.EXP, ctx, a)


def abs(ctx: Context, a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    """``|a|`` (ggml_abs)."""
    return _unary("abs", UnaryOp.ABS, ctx, a)


def relu(ctx: Context, a: Tensor) -> Tensor:
    """``max(a, 0)``; the gradient at 0 is 0 (ggml_relu)."""
    return _unary("relu", UnaryOp.RELU, ctx, a)


def gelu(ctx: Context, a: Tensor) -> Tensor:
    """GELU, tanh approximation (ggml_gelu)."""
    return _unary("gelu", UnaryOp.GELU, ctx, a)


def silu(ctx: Context, a: Tensor) -> Tensor:
    """``a * sigmoid(a)`` (ggml_silu)."""
    return _unary("silu", UnaryOp.SILU, ctx, a)


def tanh(ctx: Context, a: Tensor) -> Tensor:
    """``tanh(a)`` (ggml_tanh)."""
    return _unary("tanh", UnaryOp.TANH, ctx, a)


def sigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``1 / (1 + exp(-a))`` (ggml_sigmoid)."""
    return _unary("sigmoid", UnaryOp.SIGMOID, ctx, a)


def step(ctx: Context, a: Tensor) -> Tensor:
    """``1 if a > 0 else 0``; not differentiable (ggml_step)."""
    return _unary("step", UnaryOp.STEP, ctx, a)


def _unary_back(ctx: Context, uop: UnaryOp, x: Tensor, g: Tensor) -> Tensor:
    """``g * f'(x)`` for the unary function ``uop`` in one fused pass."""
    return ctx.new_op(F32, x.ne, Op.UNARY_BACK, (x, g), uop)


@backward(Op.UNARY)
def _unary_op_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    uop = params_of(node, UnaryOp)
    if not sink.needs(0):
        return
    if uop is UnaryOp.NEG:
        sink.sub(0, g)
    elif uop is UnaryOp.EXP:
        sink.add(0, mul(ctx, g, node))
    else:
        sink.add(0, _unary_back(ctx, uop, node.src[0], g))


ignore_sources(Op.UNARY, 0, when=lambda node: node.op_params is UnaryOp.STEP)
