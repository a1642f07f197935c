"""Convolution and pooling: im2col and its adjoint, the direct convolution conv_2d_direct
(what conv_2d builds) with its two gradients, pool_2d.

Kernels: :mod:`ggopt._kernels._conv`; compilers: ``backend/*_ops/conv.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..context import Context, normalize_ne
from ..errors import DTypeError, InvalidValueError, ShapeError
from ..tensor import Op, Tensor
from ..types import F32, GGType
from ._base import (
    GradSink,
    as_int,
    backward,
    check_choice,
    check_ctx,
    check_f32,
    check_tensor,
    ignore_sources,
    ne_str,
    params_of,
)

__all__ = [
    "OP_POOL_MAX", "OP_POOL_AVG", "Im2ColParams", "Conv2DParams", "PoolParams", "im2col",
    "im2col_back", "conv_2d", "conv_2d_direct", "conv_2d_back_input", "conv_2d_back_kernel",
    "pool_2d", "pool_2d_back",
]

OP_POOL_MAX = 0
OP_POOL_AVG = 1
_POOL_OPS = {OP_POOL_MAX: "OP_POOL_MAX", OP_POOL_AVG: "OP_POOL_AVG"}


@dataclass(frozen=True, slots=True)
class Im2ColParams:
    """``Op.IM2COL``/``Op.IM2COL_BACK``: strides, paddings and dilations (x: 0, y: 1)."""

    s0: int
    s1: int
    p0: int
    p1: int
    d0: int
    d1: int


@dataclass(frozen=True, slots=True)
class Conv2DParams:
    """``Op.CONV_2D`` and its gradient ops: strides, paddings and dilations (x: 0, y: 1)."""

    s0: int
    s1: int
    p0: int
    p1: int
    d0: int
    d1: int


@dataclass(frozen=True, slots=True)
class PoolParams:
    """``Op.POOL_2D``/``Op.POOL_2D_BACK``: ``op`` (OP_POOL_MAX/AVG), window, stride, padding."""

    op: int
    k0: int
    k1: int
    s0: int
    s1: int
    p0: int
    p1: int


def _conv_out(fn: str, size: int, k: int, s: int, p: int, d: int) -> int:
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if out <= 0:
        raise ShapeError(f"ggml_{fn}: input size {size} with kernel {k}, stride {s}, padding {p}, "
                         f"dilation {d} gives an empty output")
    return out


#: Kernel sizes, strides, paddings and dilations reach the kernels as C ints.
_INT32_LIMIT = 2**31


def _conv_params(fn: str, **params: int | float) -> tuple[int, ...]:
    """Window sizes (k*), strides (s*) and dilations (d*) >= 1, paddings (p*) >= 0, all
    below 2**31."""
    vals = []
    for name, v in params.items():
        if isinstance(v, float) and v.is_integer():  # ggml passes pool padding as float
            v = int(v)
        v = as_int(fn, name, v)
        if (name[0] in "ksd" and v < 1) or (name[0] == "p" and v < 0):
            raise ShapeError(f"ggml_{fn}: {name} must be "
                             f"{'>= 1' if name[0] in 'ksd' else '>= 0'}, got {v}")
        if v >= _INT32_LIMIT:
            raise ShapeError(f"ggml_{fn}: {name} must be < 2**31, got {v}")
        vals.append(v)
    return tuple(vals)


def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
           d1: int, is_2D: bool = True, dst_type: GGType = F32) -> Tensor:
    """Unfold image patches (ggml_im2col).

    ``a`` is the kernel ``[KW, KH, IC, OC]`` (used for its shape only), ``b`` the input
    ``[IW, IH, IC, N]``; the result is ``[IC*KH*KW, OW, OH, N]``. ggopt computes in float32.
    """
    check_ctx("im2col", ctx)
    check_tensor("im2col", "a", a)
    check_f32("im2col", b=b)
    if not is_2D:
        raise InvalidValueError("ggml_im2col: only 2-D im2col (is_2D=True) is supported by "
                                "ggopt")
    if dst_type != F32:
        raise DTypeError("ggml_im2col: ggopt computes convolutions in float32; dst_type must "
                         "be F32")
    if a.ne[2] != b.ne[2]:
        raise ShapeError(f"ggml_im2col: kernel channels a.ne[2]={a.ne[2]} must equal input "
                         f"channels b.ne[2]={b.ne[2]}")
    p = Im2ColParams(*_conv_params("im2col", s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))
    KW, KH = _conv_params("im2col", kw=a.ne[0], kh=a.ne[1])
    OW = _conv_out("im2col", b.ne[0], KW, p.s0, p.p0, p.d0)
    OH = _conv_out("im2col", b.ne[1], KH, p.s1, p.p1, p.d1)
    return ctx.new_op(F32, (b.ne[2] * KH * KW, OW, OH, b.ne[3]), Op.IM2COL, (a, b), p)


def im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: tuple[int, ...], s0: int, s1: int,
                p0: int, p1: int, d0: int, d1: int, is_2D: bool = True) -> Tensor:
    """Adjoint of :func:`im2col`: fold ``a`` back into an input of shape ``ne``.

    ggml: ``ggml_im2col_back``.
    """
    check_ctx("im2col_back", ctx)
    check_f32("im2col_back", a=a)
    check_tensor("im2col_back", "b", b)
    if not is_2D:
        raise InvalidValueError("ggml_im2col_back: only 2-D im2col is supported by ggopt")
    ne = normalize_ne(ne)
    p = Im2ColParams(*_conv_params("im2col_back", s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))
    KW, KH = _conv_params("im2col_back", kw=b.ne[0], kh=b.ne[1])
    OW = _conv_out("im2col_back", ne[0], KW, p.s0, p.p0, p.d0)
    OH = _conv_out("im2col_back", ne[1], KH, p.s1, p.p1, p.d1)
    want = (ne[2] * KH * KW, OW, OH, ne[3])
    if a.ne != want:
        raise ShapeError(f"ggml_im2col_back: gradient {ne_str(a)} must be {list(want)}")
    return ctx.new_op(F32, ne, Op.IM2COL_BACK, (a, b), p)


@backward(Op.IM2COL)
def _im2col_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(1):
        k, x = node.src
        p = params_of(node, Im2ColParams)
        sink.add(1, im2col_back(ctx, g, k, x.ne, p.s0, p.s1, p.p0, p.p1, p.d0, p.d1))


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
            d1: int) -> Tensor:
    """2-D cross-correlation (ggml_conv_2d).

    ``a`` is the kernel ``[KW, KH, IC, OC]``, ``b`` the input ``[IW, IH, IC, N]``; the result is
    ``[OW, OH, OC, N]`` (NCHW in NumPy terms, PyTorch's ``conv2d``). ggml composes it from
    im2col, mul_mat and a permuted copy; ggopt computes in float32, where that composition and
    :func:`conv_2d_direct` agree to rounding, and builds the one direct node.
    """
    check_f32("conv_2d", a=a, b=b)
    return conv_2d_direct(ctx, a, b, s0, s1, p0, p1, d0, d1)


#: OH*OW, IC*KH*KW and OC reach BLAS as C ints.
_BLAS_LIMIT = 2**31


def _conv_geometry(fn: str, kernel_ne: tuple[int, ...], image_ne: tuple[int, ...],
                   params: dict[str, int]) -> tuple[Conv2DParams, tuple[int, int, int, int]]:
    """The checked parameters and the output ``ne`` ``[OW, OH, OC, N]`` of a convolution of
    an image of ``image_ne`` by a kernel of ``kernel_ne``."""
    if kernel_ne[2] != image_ne[2]:
        raise ShapeError(f"ggml_{fn}: kernel channels {kernel_ne[2]} (ne[2]) must equal input "
                         f"channels {image_ne[2]} (ne[2])")
    p = Conv2DParams(*_conv_params(fn, **params))
    KW, KH = _conv_params(fn, kw=kernel_ne[0], kh=kernel_ne[1])
    OW = _conv_out(fn, image_ne[0], KW, p.s0, p.p0, p.d0)
    OH = _conv_out(fn, image_ne[1], KH, p.s1, p.p1, p.d1)
    OC = kernel_ne[3]
    if max(OW * OH, kernel_ne[2] * KH * KW, OC) >= _BLAS_LIMIT:
        raise ShapeError(f"ggml_{fn}: OH*OW={OH * OW}, IC*KH*KW={kernel_ne[2] * KH * KW} and "
                         f"OC={OC} must each be below 2**31")
    return p, (OW, OH, OC, image_ne[3])


def conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int,
                   d0: int, d1: int) -> Tensor:
    """2-D cross-correlation as one node (ggml_conv_2d_direct, ``Op.CONV_2D``).

    ``a`` is the kernel ``[KW, KH, IC, OC]``, ``b`` the input ``[IW, IH, IC, N]``; the result is
    ``[OW, OH, OC, N]``, with ``OW = (IW + 2*p0 - d0*(KW - 1) - 1) // s0 + 1`` (OH likewise).
    """
    check_ctx("conv_2d_direct", ctx)
    check_f32("conv_2d_direct", a=a, b=b)
    p, ne = _conv_geometry("conv_2d_direct", a.ne, b.ne,
                           dict(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))
    return ctx.new_op(F32, ne, Op.CONV_2D, (a, b), p)


def conv_2d_back_input(ctx: Context, a: Tensor, g: Tensor, ne: tuple[int, ...], s0: int,
                       s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """Gradient of :func:`conv_2d_direct` with respect to its input, of shape ``ne``, from
    the kernel ``a`` and the output gradient ``g`` (``Op.CONV_2D_BACK_INPUT``)."""
    fn = "conv_2d_back_input"
    check_ctx(fn, ctx)
    check_f32(fn, a=a, g=g)
    ne = normalize_ne(ne)
    p, out = _conv_geometry(fn, a.ne, ne, dict(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))
    if g.ne != out:
        raise ShapeError(f"ggml_{fn}: gradient {ne_str(g)} must be {list(out)}")
    return ctx.new_op(F32, ne, Op.CONV_2D_BACK_INPUT, (a, g), p)


def conv_2d_back_kernel(ctx: Context, b: Tensor, g: Tensor, ne: tuple[int, ...], s0: int,
                        s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """Gradient of :func:`conv_2d_direct` with respect to its kernel, of shape ``ne``
    (``[KW, KH, IC, OC]``), from the input ``b`` and the output gradient ``g``
    (``Op.CONV_2D_BACK_KERNEL``)."""
    fn = "conv_2d_back_kernel"
    check_ctx(fn, ctx)
    check_f32(fn, b=b, g=g)
    ne = normalize_ne(ne)
    p, out = _conv_geometry(fn, ne, b.ne, dict(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))
    if g.ne != out:
        raise ShapeError(f"ggml_{fn}: gradient {ne_str(g)} must be {list(out)}")
    return ctx.new_op(F32, ne, Op.CONV_2D_BACK_KERNEL, (b, g), p)


@backward(Op.CONV_2D)
def _conv_2d_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    k, x = node.src
    p = params_of(node, Conv2DParams)
    prm = (p.s0, p.s1, p.p0, p.p1, p.d0, p.d1)
    if sink.needs(0):
        sink.add(0, conv_2d_back_kernel(ctx, x, g, k.ne, *prm))
    if sink.needs(1):
        sink.add(1, conv_2d_back_input(ctx, k, g, x.ne, *prm))


def pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int, s1: int, p0: float,
            p1: float) -> Tensor:
    """2-D max or average pooling of ``a=[IW, IH, C, N]`` (ggml_pool_2d).

    ``op`` is :data:`OP_POOL_MAX` or :data:`OP_POOL_AVG`; output size ``(I + 2p - k)/s + 1``.
    """
    check_ctx("pool_2d", ctx)
    check_f32("pool_2d", a=a)
    op = check_choice("pool_2d", "op", op, _POOL_OPS)
    p = PoolParams(op, *_conv_params("pool_2d", k0=k0, k1=k1, s0=s0, s1=s1, p0=p0, p1=p1))
    OW = math.trunc((a.ne[0] + 2 * p.p0 - p.k0) / p.s0) + 1
    OH = math.trunc((a.ne[1] + 2 * p.p1 - p.k1) / p.s1) + 1
    if OW <= 0 or OH <= 0:
        raise ShapeError(f"ggml_pool_2d: input {ne_str(a)} is smaller than the window {k0}x{k1}")
    return ctx.new_op(F32, (OW, OH, a.ne[2], a.ne[3]), Op.POOL_2D, (a,), p)


def pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: int, k0: int, k1: int, s0: int,
                 s1: int, p0: float, p1: float) -> Tensor:
    """Gradient of :func:`pool_2d` w.r.t. its input ``af`` given the output gradient ``a``."""
    check_ctx("pool_2d_back", ctx)
    check_f32("pool_2d_back", a=a, af=af)
    k0, k1, s0, s1, p0, p1 = _conv_params("pool_2d_back", k0=k0, k1=k1, s0=s0, s1=s1, p0=p0,
                                          p1=p1)
    OW = math.trunc((af.ne[0] + 2 * p0 - k0) / s0) + 1
    OH = math.trunc((af.ne[1] + 2 * p1 - k1) / s1) + 1
    if a.ne != (OW, OH, af.ne[2], af.ne[3]):
        raise ShapeError(f"ggml_pool_2d_back: gradient {ne_str(a)} does not match the pooled "
                         f"shape {[OW, OH, af.ne[2], af.ne[3]]}")
    op = check_choice("pool_2d_back", "op", op, _POOL_OPS)
    return ctx.new_op(F32, af.ne, Op.POOL_2D_BACK, (a, af), PoolParams(op, k0, k1, s0, s1, p0, p1))


@backward(Op.POOL_2D)
def _pool_2d_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        p = params_of(node, PoolParams)
        sink.add(0, pool_2d_back(ctx, g, node.src[0], p.op, p.k0, p.k1, p.s0, p.s1, p.p0, p.p1))


ignore_sources(Op.IM2COL, 0)
ignore_sources(Op.IM2COL_BACK, 0)
