"""Attention scores: softmax with scale, mask and ALiBi (ggml_soft_max_ext) and its gradient,
and the causal masks diag_mask_inf / diag_mask_zero.

Kernels: :mod:`ggopt._kernels._softmax` (no mask), :mod:`ggopt._kernels._attn`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32
from ._base import (
    GradSink,
    as_int,
    as_scalar,
    backward,
    check_ctx,
    check_f32,
    check_tensor,
    check_type,
    ne_str,
    params_of,
)

__all__ = ["DiagMaskParams", "SoftMaxParams", "diag_mask_inf", "diag_mask_zero", "soft_max",
           "soft_max_ext", "soft_max_ext_back"]


@dataclass(frozen=True, slots=True)
class SoftMaxParams:
    """``Op.SOFT_MAX`` / ``Op.SOFT_MAX_BACK``: softmax of ``scale*a + slope*mask`` along ``ne0``,
    ``slope`` ALiBi's per-head slope when ``max_bias > 0``, else 1."""

    scale: float
    max_bias: float


@dataclass(frozen=True, slots=True)
class DiagMaskParams:
    """``Op.DIAG_MASK_INF`` / ``Op.DIAG_MASK_ZERO``: columns ``i0 > n_past + i1`` are masked."""

    n_past: int


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Softmax along ``ne0`` (ggml_soft_max)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0)


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                 max_bias: float) -> Tensor:
    """``softmax(scale*a + slope*mask)`` along ``ne0`` (ggml_soft_max_ext).

    ``mask`` (optional, F32) is ``[ne0, >= ne1, m2, m3]`` with ``m2``, ``m3`` dividing ``a``'s
    ``ne2``, ``ne3``: row ``i1`` of matrix ``(i2, i3)`` adds mask row ``i1`` of mask matrix
    ``(i2 % m2, i3 % m3)``, e.g. one causal ``[n_kv, n_tokens]`` mask for every head. With
    ``max_bias > 0`` head ``i2`` (of ``ne2``) scales the mask by its ALiBi slope. PyTorch:
    ``softmax(scale * a + mask, dim=-1)``. The mask gets no gradient.
    """
    fn = "soft_max_ext"
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    scale = as_scalar(fn, "scale", scale)
    max_bias = as_scalar(fn, "max_bias", max_bias)
    if mask is None:
        if max_bias > 0:
            raise ShapeError("ggml_soft_max_ext: ALiBi (max_bias > 0) needs a mask")
        return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a,), SoftMaxParams(scale, max_bias))
    check_tensor(fn, "mask", mask)
    check_type(fn, "mask", mask, F32)
    m = mask.ne
    if m[0] != a.ne[0] or m[1] < a.ne[1] or 0 in m or a.ne[2] % m[2] or a.ne[3] % m[3]:
        raise ShapeError(f"ggml_soft_max_ext: the mask {ne_str(mask)} does not broadcast over "
                         f"a {ne_str(a)}: it needs ne0 == {a.ne[0]}, ne1 >= {a.ne[1]}, and "
                         "ne2, ne3 dividing a's")
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a, mask), SoftMaxParams(scale, max_bias))


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float,
                      max_bias: float) -> Tensor:
    """The gradient of :func:`soft_max_ext` w.r.t. its input, given the output gradient ``a``
    and the softmax output ``b``: ``scale * b * (a - sum(a*b))`` per row
    (ggml_soft_max_ext_back). ``max_bias`` only scales the mask, so it does not enter."""
    fn = "soft_max_ext_back"
    check_ctx(fn, ctx)
    check_f32(fn, a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_{fn}: the gradient a {ne_str(a)} and the softmax output b "
                         f"{ne_str(b)} must have one shape")
    prm = SoftMaxParams(as_scalar(fn, "scale", scale), as_scalar(fn, "max_bias", max_bias))
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX_BACK, (a, b), prm)


@backward(Op.SOFT_MAX)
def _soft_max_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if len(node.src) > 1 and sink.needs(1):
        raise ShapeError("ggml_soft_max_ext: the mask gets no gradient; it must not depend on a "
                         "parameter")
    if sink.needs(0):
        prm = params_of(node, SoftMaxParams)
        sink.add(0, soft_max_ext_back(ctx, g, node, prm.scale, prm.max_bias))


def _diag_mask(fn: str, op: Op, ctx: Context, a: Tensor, n_past: int) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    n_past = as_int(fn, "n_past", n_past)
    if n_past < 0:
        raise ShapeError(f"ggml_{fn}: n_past must be >= 0, got {n_past}")
    return ctx.new_op(F32, a.ne, op, (a,), DiagMaskParams(n_past))


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """``a`` with ``-inf`` in every column ``i0 > n_past + i1`` of row ``i1`` (ggml_diag_mask_inf):
    the causal mask of ``[n_kv, n_tokens, ...]`` attention scores."""
    return _diag_mask("diag_mask_inf", Op.DIAG_MASK_INF, ctx, a, n_past)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """``a`` with 0 in every column ``i0 > n_past + i1`` of row ``i1`` (ggml_diag_mask_zero)."""
    return _diag_mask("diag_mask_zero", Op.DIAG_MASK_ZERO, ctx, a, n_past)


@backward(Op.DIAG_MASK_INF)
@backward(Op.DIAG_MASK_ZERO)
def _diag_mask_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, diag_mask_zero(ctx, g, params_of(node, DiagMaskParams).n_past))
