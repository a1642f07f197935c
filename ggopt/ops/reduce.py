"""Reductions, tiling and integer ops: sum, sum_rows, mean, repeat, repeat_back, argmax,
count_equal.

Kernels: :mod:`ggopt._kernels._reduce`; compilers: ``backend/*_ops/reduce.py``.
"""

from __future__ import annotations

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32, I32, I64
from . import elementwise as _ew
from ._base import (
    GradSink,
    backward,
    can_repeat,
    check_ctx,
    check_f32,
    check_tensor,
    check_type,
    ne_str,
)

__all__ = ["sum", "sum_rows", "mean", "repeat", "repeat_back", "argmax", "count_equal"]


def sum(ctx: Context, a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    """The scalar sum of all elements, accumulated in double (ggml_sum)."""
    check_ctx("sum", ctx)
    check_f32("sum", a=a)
    return ctx.new_op(F32, (1, 1, 1, 1), Op.SUM, (a,))


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Row sums: ``[ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]`` (ggml_sum_rows)."""
    check_ctx("sum_rows", ctx)
    check_f32("sum_rows", a=a)
    return ctx.new_op(F32, (1,) + a.ne[1:], Op.SUM_ROWS, (a,))


def mean(ctx: Context, a: Tensor) -> Tensor:
    """Row means: ``[ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]`` (ggml_mean)."""
    check_ctx("mean", ctx)
    check_f32("mean", a=a)
    return ctx.new_op(F32, (1,) + a.ne[1:], Op.MEAN, (a,))


@backward(Op.SUM)
@backward(Op.SUM_ROWS)
def _sum_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat(ctx, g, node.src[0]))


@backward(Op.MEAN)
def _mean_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        sink.add(0, repeat(ctx, _ew.scale(ctx, g, 1.0 / a.ne[0]), a))


def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` tiled to the shape of ``b`` (ggml_repeat)."""
    check_ctx("repeat", ctx)
    check_f32("repeat", a=a)
    check_tensor("repeat", "b", b)
    if not can_repeat(a, b):
        raise ShapeError(f"ggml_repeat: a {ne_str(a)} does not tile b {ne_str(b)}")
    return ctx.new_op(F32, b.ne, Op.REPEAT, (a,))


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` summed over its tiles into the shape of ``b`` (ggml_repeat_back)."""
    check_ctx("repeat_back", ctx)
    check_f32("repeat_back", a=a)
    check_tensor("repeat_back", "b", b)
    if not can_repeat(b, b) or not can_repeat(b, a):
        raise ShapeError(f"ggml_repeat_back: b {ne_str(b)} does not tile a {ne_str(a)}")
    return ctx.new_op(F32, b.ne, Op.REPEAT_BACK, (a,))


@backward(Op.REPEAT)
def _repeat_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat_back(ctx, g, node.src[0]))


@backward(Op.REPEAT_BACK)
def _repeat_back_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, repeat(ctx, g, node.src[0]))


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the maximum of each row, the last one on ties: I32 ``[ne1]`` (ggml_argmax)."""
    check_ctx("argmax", ctx)
    check_f32("argmax", a=a)
    if not a.is_matrix():
        raise ShapeError(f"ggml_argmax: a must be a matrix (ne2 == ne3 == 1), got {ne_str(a)}")
    if a.ne[0] == 0 and a.ne[1] > 0:
        raise ShapeError(f"ggml_argmax: rows of a {ne_str(a)} are empty; no maximum")
    return ctx.new_op(I32, (a.ne[1], 1, 1, 1), Op.ARGMAX, (a,))


def count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Number of equal elements of two I32 tensors: an I64 scalar (ggml_count_equal)."""
    check_ctx("count_equal", ctx)
    check_type("count_equal", "a", a, I32)
    check_type("count_equal", "b", b, I32)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_count_equal: a {ne_str(a)} and b {ne_str(b)} differ in shape")
    return ctx.new_op(I64, (1, 1, 1, 1), Op.COUNT_EQUAL, (a, b))
