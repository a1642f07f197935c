"""Convolution and pooling: im2col and its adjoint, conv_2d (im2col + mul_mat), pool_2d.

Kernels: :mod:`ggopt._kernels._conv`; compilers: ``backend/*_ops/conv.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..context import Context, normalize_ne
from ..errors import DTypeError, ShapeError
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
from .linalg import mul_mat
from .views import cont, permute, reshape_2d, reshape_4d

__all__ = [
    "OP_POOL_MAX", "OP_POOL_AVG", "Im2ColParams", "PoolParams", "im2col", "im2col_back",
    "conv_2d", "pool_2d", "pool_2d_back",
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
        raise ShapeError("ggml_im2col: only 2-D im2col (is_2D=True) is supported by ggopt")
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
        raise ShapeError("ggml_im2col_back: only 2-D im2col is supported by ggopt")
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
    """2-D cross-correlation as ggml composes it: im2col, then mul_mat (ggml_conv_2d).

    ``a`` is the kernel ``[KW, KH, IC, OC]``, ``b`` the input ``[IW, IH, IC, N]``; the result is
    ``[OW, OH, OC, N]`` (NCHW in NumPy terms, PyTorch's ``conv2d``).
    """
    check_f32("conv_2d", a=a, b=b)
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, F32)
    K, OW, OH, N = cols.ne
    res = mul_mat(ctx, reshape_2d(ctx, cols, K, OW * OH * N), reshape_2d(ctx, a, K, a.ne[3]))
    res = reshape_4d(ctx, res, OW, OH, N, a.ne[3])
    return cont(ctx, permute(ctx, res, 0, 1, 3, 2))


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
