"""Element-wise ops of the transformer: swiglu (fused and split), silu_back, sin, cos, add1.

Kernels: :mod:`ggopt._kernels._pointwise` (add1 runs the element-wise add kernel, silu_back
the unary-gradient kernel); compilers: ``backend/*_ops/pointwise.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor, UnaryOp
from ..types import F32
from ._base import GradSink, backward, check_ctx, check_f32, ne_str, params_of, unary_f32
from .elementwise import mul
from .reduce import sum as _sum
from .views import concat, view_4d

__all__ = ["GluParams", "add1", "cos", "silu_back", "sin", "swiglu", "swiglu_split",
           "swiglu_swapped"]


@dataclass(frozen=True, slots=True)
class GluParams:
    """``Op.GLU`` (swiglu): with one source, ``swapped`` takes the gate from the second half;
    ``ggml_order``: a two-source swiglu in ggml's float order (:func:`ggopt.set_ggml_order`)."""

    swapped: bool
    ggml_order: bool = False


def _swiglu(fn: str, ctx: Context, a: Tensor, swapped: bool) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    if a.ne[0] % 2:
        raise ShapeError(f"ggml_{fn}: a.ne[0] must be even (two halves), got {ne_str(a)}")
    return ctx.new_op(F32, (a.ne[0] // 2,) + a.ne[1:], Op.GLU, (a,), GluParams(swapped))


def swiglu(ctx: Context, a: Tensor) -> Tensor:
    """``silu(a[:n]) * a[n:]`` over the two halves of every row (ggml_swiglu): ``[2n, ...]``
    gives ``[n, ...]``."""
    return _swiglu("swiglu", ctx, a, False)


def swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``silu(a[n:]) * a[:n]``: :func:`swiglu` with the gate in the second half
    (ggml_swiglu_swapped)."""
    return _swiglu("swiglu_swapped", ctx, a, True)


def swiglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``silu(a) * b`` (ggml_swiglu_split; llama's FFN: ``silu(gate) * up``)."""
    check_ctx("swiglu_split", ctx)
    check_f32("swiglu_split", a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_swiglu_split: a {ne_str(a)} and b {ne_str(b)} must have one "
                         "shape")
    return ctx.new_op(F32, a.ne, Op.GLU, (a, b), GluParams(False))


def silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a * silu'(b)``: the gradient of silu at ``b`` given the output gradient ``a``
    (ggml_silu_back)."""
    check_ctx("silu_back", ctx)
    check_f32("silu_back", a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_silu_back: a {ne_str(a)} and b {ne_str(b)} must have one shape")
    return ctx.new_op(F32, b.ne, Op.UNARY_BACK, (b, a), UnaryOp.SILU)


def _halves(ctx: Context, a: Tensor) -> tuple[Tensor, Tensor]:
    n = a.ne[0] // 2
    lo = view_4d(ctx, a, n, a.ne[1], a.ne[2], a.ne[3], a.nb[1], a.nb[2], a.nb[3], 0)
    hi = view_4d(ctx, a, n, a.ne[1], a.ne[2], a.ne[3], a.nb[1], a.nb[2], a.nb[3],
                      n * a.nb[0])
    return lo, hi


@backward(Op.GLU)
def _glu_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    # y = silu(x) * u: dx = silu'(x) * u * g, du = silu(x) * g. ggml builds du as
    # mul(silu(x), g); swiglu_split(x, g) is the same arithmetic in one pass (the same bits).
    if len(node.src) == 2:
        x, u = node.src
        if sink.needs(0):
            sink.add(0, silu_back(ctx, mul(ctx, g, u), x))
        if sink.needs(1):
            sink.add(1, swiglu_split(ctx, x, g))
        return
    if sink.needs(0):
        swapped = params_of(node, GluParams).swapped
        x, u = _halves(ctx, node.src[0])
        if swapped:
            x, u = u, x
        dx = silu_back(ctx, mul(ctx, g, u), x)
        du = swiglu_split(ctx, x, g)
        sink.add(0, concat(ctx, du, dx, 0) if swapped else concat(ctx, dx, du, 0))


def sin(ctx: Context, a: Tensor) -> Tensor:
    """``sin(a)`` (ggml_sin)."""
    return unary_f32("sin", Op.SIN, ctx, a)


def cos(ctx: Context, a: Tensor) -> Tensor:
    """``cos(a)`` (ggml_cos)."""
    return unary_f32("cos", Op.COS, ctx, a)


@backward(Op.SIN)
def _sin_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, mul(ctx, g, cos(ctx, node.src[0])))


@backward(Op.COS)
def _cos_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.sub(0, mul(ctx, g, sin(ctx, node.src[0])))


def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` for a scalar ``b`` (ggml_add1)."""
    check_ctx("add1", ctx)
    check_f32("add1", a=a, b=b)
    if not b.is_scalar():
        raise ShapeError(f"ggml_add1: b must be a scalar, got {ne_str(b)}")
    return ctx.new_op(F32, a.ne, Op.ADD1, (a, b))


@backward(Op.ADD1)
def _add1_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):  # the sum (ggml takes the mean here, a known ggml bug)
        sink.add(1, _sum(ctx, g))
