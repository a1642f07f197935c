"""Softmax and cross-entropy loss, forward and backward.

Kernels: :mod:`ggopt._kernels._softmax`; compilers: ``backend/*_ops/softmax.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32
from ._base import GradSink, as_scalar, backward, check_ctx, check_f32, ne_str, params_of
from .elementwise import scale as _scale

__all__ = ["SoftMaxParams", "soft_max", "soft_max_ext", "cross_entropy_loss",
           "cross_entropy_loss_back"]


@dataclass(frozen=True, slots=True)
class SoftMaxParams:
    """``Op.SOFT_MAX``: softmax of ``scale * a`` along ``ne0``."""

    scale: float


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Softmax along ``ne0`` (ggml_soft_max)."""
    return soft_max_ext(ctx, a, 1.0)


def soft_max_ext(ctx: Context, a: Tensor, scale: float) -> Tensor:
    """Softmax of ``scale * a`` along ``ne0`` (ggml_soft_max_ext without mask)."""
    check_ctx("soft_max", ctx)
    check_f32("soft_max", a=a)
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a,),
                      SoftMaxParams(as_scalar("soft_max", "scale", scale)))


@backward(Op.SOFT_MAX)
def _soft_max_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        back = ctx.new_op(F32, node.ne, Op.SOFT_MAX_BACK, (g, node))
        s = params_of(node, SoftMaxParams).scale
        sink.add(0, back if s == 1.0 else _scale(ctx, back, s))


def cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Mean over rows of ``-sum(b * log_softmax(a))``: a scalar (ggml_cross_entropy_loss).

    ``a`` holds logits and ``b`` target probabilities, both ``[nclasses, nrows, ...]``.
    """
    check_ctx("cross_entropy_loss", ctx)
    check_f32("cross_entropy_loss", a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {ne_str(a)} and labels "
                         f"{ne_str(b)} must have the same shape")
    if a.nelements() == 0:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {ne_str(a)} need at least one class "
                         "and one row (the loss is a mean over rows)")
    return ctx.new_op(F32, (1, 1, 1, 1), Op.CROSS_ENTROPY_LOSS, (a, b))


def cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Gradient of :func:`cross_entropy_loss` w.r.t. the logits ``b`` given the scalar
    output gradient ``a`` and labels ``c`` (ggml_cross_entropy_loss_back)."""
    check_ctx("cross_entropy_loss_back", ctx)
    check_f32("cross_entropy_loss_back", a=a, b=b, c=c)
    if not a.is_scalar():
        raise ShapeError(f"ggml_cross_entropy_loss_back: the gradient must be a scalar, got "
                         f"{ne_str(a)}")
    if b.ne != c.ne:
        raise ShapeError(f"ggml_cross_entropy_loss_back: logits {ne_str(b)} and labels "
                         f"{ne_str(c)} must have the same shape")
    return ctx.new_op(F32, b.ne, Op.CROSS_ENTROPY_LOSS_BACK, (a, b, c))


@backward(Op.CROSS_ENTROPY_LOSS)
def _ce_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(1):
        raise ShapeError("ggml_cross_entropy_loss: gradients w.r.t. the labels are not supported; "
                         "the labels must not depend on a parameter")
    if sink.needs(0):
        sink.add(0, cross_entropy_loss_back(ctx, g, a, b))
