"""Row normalizations along ``ne0``: rms_norm (llama) and norm (LayerNorm without affine),
each with its gradient op.

Kernels: :mod:`ggopt._kernels._norm`; compilers: ``backend/*_ops/norm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import InvalidValueError, ShapeError
from ..tensor import Op, Tensor
from ..types import F32
from ._base import GradSink, as_scalar, backward, check_ctx, check_f32, ne_str, params_of

__all__ = ["NormParams", "norm", "norm_back", "rms_norm", "rms_norm_back"]


@dataclass(frozen=True, slots=True)
class NormParams:
    """``Op.NORM``, ``Op.RMS_NORM`` and their gradient ops: the epsilon under the root;
    ``ggml_order``: an RMS_NORM in ggml's float order (:func:`ggopt.set_ggml_order`)."""

    eps: float
    ggml_order: bool = False


def _norm_op(fn: str, op: Op, ctx: Context, a: Tensor, eps: float) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    eps = as_scalar(fn, "eps", eps)
    if not eps >= 0:
        raise InvalidValueError(f"ggml_{fn}: eps must be >= 0, got {eps}")
    return ctx.new_op(F32, a.ne, op, (a,), NormParams(eps))


def _norm_back_op(fn: str, op: Op, ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_{fn}: the gradient a {ne_str(a)} must have the shape of the "
                         f"input b {ne_str(b)}")
    eps = as_scalar(fn, "eps", eps)
    if not eps >= 0:
        raise InvalidValueError(f"ggml_{fn}: eps must be >= 0, got {eps}")
    return ctx.new_op(F32, a.ne, op, (a, b), NormParams(eps))


def rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """``a / sqrt(mean(a**2) + eps)`` per row of ``ne0`` (ggml_rms_norm; llama's norm)."""
    return _norm_op("rms_norm", Op.RMS_NORM, ctx, a, eps)


def rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """The gradient of :func:`rms_norm` w.r.t. its input ``b``, given the output gradient
    ``a`` (ggml_rms_norm_back)."""
    return _norm_back_op("rms_norm_back", Op.RMS_NORM_BACK, ctx, a, b, eps)


def norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """``(a - mean(a)) / sqrt(var(a) + eps)`` per row of ``ne0``, biased variance (ggml_norm;
    PyTorch's ``layer_norm`` without weight and bias)."""
    return _norm_op("norm", Op.NORM, ctx, a, eps)


def norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """The gradient of :func:`norm` w.r.t. its input ``b``, given the output gradient ``a``.

    ggml has no backward for norm; ggopt adds this op (same argument order as rms_norm_back).
    """
    return _norm_back_op("norm_back", Op.NORM_BACK, ctx, a, b, eps)


@backward(Op.RMS_NORM)
def _rms_norm_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, rms_norm_back(ctx, g, node.src[0], params_of(node, NormParams).eps))


@backward(Op.NORM)
def _norm_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, norm_back(ctx, g, node.src[0], params_of(node, NormParams).eps))
