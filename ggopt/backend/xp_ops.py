"""Compilers from graph nodes to steps written with an array module ``xp`` (NumPy or CuPy).

Each compiler binds the arrays of the node and of its sources once and returns a
zero-argument step that writes the node's array in place. The semantics are ggml's, as in
the CPU backend: ``b`` tiles ``a`` in binary ops, argmax picks the last maximum, sums
accumulate in float64, a max-pool gradient goes to the first strict maximum of its window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from ..ops import OP_POOL_MAX
from ..tensor import Op, Tensor, UnaryOp
from .base import Step, check_row_indices

if TYPE_CHECKING:
    from .xp import ArrayBackend

__all__ = [
    "COMPILERS", "Compiler", "UNARY", "UNARY_BACK", "ce_rows", "check_unary_back", "split_axes",
    "tile_split",
]

Compiler = Callable[["ArrayBackend", Tensor, tuple], Step]
COMPILERS: dict[Op, Compiler] = {}

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
GELU_K = F32(0.7978845608028654)  # sqrt(2/pi), ggml's tanh-approximated GELU
GELU_A = F32(0.044715)


def compiler(*ops: Op) -> Callable[[Compiler], Compiler]:
    def register(fn: Compiler) -> Compiler:
        for op in ops:
            COMPILERS[op] = fn
        return fn

    return register


# --- views --------------------------------------------------------------------------------


def split_axes(xp, arr, groups: Sequence[tuple[int, ...]]):
    """A view of ``arr`` whose axis ``i`` is split into the sizes ``groups[i]`` (outer first).

    The sizes of a group multiply to the axis length (size-1 entries may be inserted), so the
    result is always a view of the same memory, never a copy.
    """
    shape: list[int] = []
    strides: list[int] = []
    for sizes, stride in zip(groups, arr.strides):
        inner = []
        for n in reversed(sizes):
            inner.append(stride)
            stride *= n
        shape += sizes
        strides += reversed(inner)
    return xp.lib.stride_tricks.as_strided(arr, tuple(shape), tuple(strides))


def tile_split(big: Sequence[int], small: Sequence[int]):
    """Axis groups that turn ggml's tiling of shape ``small`` over ``big`` into broadcasting.

    An axis where ``small`` is neither 1 nor the full length is split into ``(tiles, length)``
    for ``big`` and ``(1, length)`` for ``small``: element ``i`` of ``big`` reads ``i % length``.
    """
    gbig, gsmall = [], []
    for n_big, n_small in zip(big, small):
        if n_small in (n_big, 1):
            gbig.append((n_big,))
            gsmall.append((n_small,))
        else:
            gbig.append((n_big // n_small, n_small))
            gsmall.append((1, n_small))
    return gbig, gsmall


def _batch_split(a_shape: Sequence[int], b_shape: Sequence[int]):
    """Axis groups for ggml's dim-2/3 broadcast in mul_mat/out_prod: ``b[i3, i2]`` pairs with
    ``a[i3 // r3, i2 // r2]``, so ``b``'s batch axes split into ``(len_a, r)``."""
    ga: list[tuple[int, ...]] = []
    gb: list[tuple[int, ...]] = []
    for n_a, n_b in zip(a_shape[:2], b_shape[:2]):
        if n_a == n_b:
            ga.append((n_a,))
            gb.append((n_b,))
        else:
            ga.append((n_a, 1))
            gb.append((n_a, n_b // n_a))
    return ga, gb


def _whole(arr) -> list[tuple[int, ...]]:
    return [(n,) for n in arr.shape]


# --- element-wise ops ---------------------------------------------------------------------


@compiler(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    fn = {Op.ADD: xp.add, Op.SUB: xp.subtract, Op.MUL: xp.multiply, Op.DIV: xp.divide}[node.op]
    a, b, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    ga, gb = tile_split(a.shape, b.shape)
    a, b, d = split_axes(xp, a, ga), split_axes(xp, b, gb), split_axes(xp, d, ga)
    return lambda: fn(a, b, out=d)


@compiler(Op.SCALE)
def _scale(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    s, bias = (F32(v) for v in node.op_params)
    a, d = srcs[0].array4d(), node.array4d()
    if bias == 0:
        return lambda: xp.multiply(a, s, out=d)

    def step() -> None:
        xp.multiply(a, s, out=d)
        xp.add(d, bias, out=d)

    return step


@compiler(Op.SQR, Op.SQRT, Op.LOG)
def _simple(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    fn = {Op.SQR: be.xp.square, Op.SQRT: be.xp.sqrt, Op.LOG: be.xp.log}[node.op]
    a, d = srcs[0].array4d(), node.array4d()
    return lambda: fn(a, out=d)


def _sigmoid(xp, x):
    return F32(1) / (F32(1) + xp.exp(-x))


def _gelu_u(x):
    return GELU_K * x * (F32(1) + GELU_A * x * x)


def _gelu_back(xp, x, g):
    # d/dx x*sigmoid(2u) = s + 2*x*s*(1 - s)*u' with s = sigmoid(2u)
    s = _sigmoid(xp, F32(2) * _gelu_u(x))
    du = GELU_K * (F32(1) + F32(3) * GELU_A * x * x)
    return g * (s + F32(2) * x * s * (F32(1) - s) * du)


def _silu_back(xp, x, g):
    t = _sigmoid(xp, x)
    return g * (t * (F32(1) + x * (F32(1) - t)))


def _sigmoid_back(xp, x, g):
    t = _sigmoid(xp, x)
    return g * (t * (F32(1) - t))


def _tanh_back(xp, x, g):
    t = xp.tanh(x)
    return g * (F32(1) - t * t)


#: f(x) per unary function, as ``xp`` array expressions in float32.
UNARY: dict[UnaryOp, Callable] = {
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
UNARY_BACK: dict[UnaryOp, Callable] = {
    UnaryOp.NEG: lambda xp, x, g: -g,
    UnaryOp.EXP: lambda xp, x, g: g * xp.exp(x),
    UnaryOp.ABS: lambda xp, x, g: g * xp.sign(x),
    UnaryOp.TANH: _tanh_back,
    UnaryOp.RELU: lambda xp, x, g: xp.where(x > 0, g, F32(0)),
    UnaryOp.SIGMOID: _sigmoid_back,
    UnaryOp.SILU: _silu_back,
    UnaryOp.GELU: _gelu_back,
}


@compiler(Op.UNARY)
def _unary(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp, fn = be.xp, UNARY[node.op_params]
    a, d = srcs[0].array4d(), node.array4d()

    def step() -> None:
        d[...] = fn(xp, a)

    return step


def check_unary_back(node: Tensor) -> None:
    """Raise for unary_back of a function without a derivative (STEP)."""
    if node.op_params not in UNARY_BACK:
        raise ShapeError(f"unary_back: {node.op_params.name} has no backward pass; expected one "
                         f"of {', '.join(u.name for u in UNARY_BACK)}")


@compiler(Op.UNARY_BACK)
def _unary_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    check_unary_back(node)
    xp, fn = be.xp, UNARY_BACK[node.op_params]
    x, g, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()

    def step() -> None:
        d[...] = fn(xp, x, g)

    return step


# --- reductions and tiling ----------------------------------------------------------------


@compiler(Op.SUM)
def _sum(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, d = srcs[0].array4d(), node.array4d()

    def step() -> None:
        d[...] = xp.sum(a, dtype=xp.float64)

    return step


@compiler(Op.SUM_ROWS, Op.MEAN)
def _sum_rows(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, d = srcs[0].array4d(), node.array4d()
    inv = F32(1.0 / a.shape[3]) if a.shape[3] else F32(np.nan)
    mean = node.op is Op.MEAN

    def step() -> None:
        d[...] = xp.sum(a, axis=3, keepdims=True, dtype=xp.float64)
        if mean:
            xp.multiply(d, inv, out=d)

    return step


@compiler(Op.REPEAT)
def _repeat(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    gd, ga = tile_split(d.shape, a.shape)
    a, d = split_axes(be.xp, a, ga), split_axes(be.xp, d, gd)

    def step() -> None:
        d[...] = a

    return step


@compiler(Op.REPEAT_BACK)
def _repeat_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, d = srcs[0].array4d(), node.array4d()
    ga, gd = tile_split(a.shape, d.shape)
    a, d = split_axes(xp, a, ga), split_axes(xp, d, gd)
    axes = tuple(i for i, (n, m) in enumerate(zip(a.shape, d.shape)) if m == 1 and n != 1)

    def step() -> None:
        d[...] = xp.sum(a, axis=axes, keepdims=True, dtype=xp.float64)

    return step


@compiler(Op.ACC)
def _acc(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    nb, offset = node.op_params
    at, bt = srcs
    a, b, d = at.array4d(), bt.array4d(), node.array4d()
    part = be.view_bytes(node.buffer, node.offset + offset, b.shape,
                         (nb[3], nb[2], nb[1], nb[0]), d.dtype)
    same = at.buffer is node.buffer and at.offset == node.offset and at.nb == node.nb

    def step() -> None:
        if not same:
            d[...] = a
        xp.add(part, b, out=part)

    return step


@compiler(Op.CPY, Op.DUP, Op.CONT)
def _copy(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    a, d = srcs[0].array4d(), node.array4d()
    if a.shape == d.shape:
        def step() -> None:
            d[...] = a
    else:
        def step() -> None:
            d[...] = a.reshape(d.shape)  # ggml order: ne0 fastest, i.e. C order here
    return step


# --- softmax and cross-entropy ------------------------------------------------------------


def ce_rows(t: Tensor) -> tuple[int, int]:
    """(rows, classes) of a cross-entropy operand: rows run along ne1..ne3."""
    return t.nrows(), t.ne[0]


@compiler(Op.CROSS_ENTROPY_LOSS)
def _ce(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a4, b4, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    shape = ce_rows(srcs[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        sh = x - x.max(axis=1, keepdims=True)
        lse = xp.log(xp.sum(xp.exp(sh), axis=1, keepdims=True, dtype=xp.float64))
        d[...] = -xp.sum(y * (sh - lse)) / shape[0]

    return step


@compiler(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    g4, a4, b4 = (s.array4d() for s in srcs)
    shape = ce_rows(srcs[1])
    d = node.array4d().reshape(shape)
    nrows = F32(shape[0])

    def step() -> None:
        x, y = a4.reshape(shape), b4.reshape(shape)
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        inv = (1.0 / xp.sum(e, axis=1, keepdims=True, dtype=xp.float64)).astype(xp.float32)
        d[...] = (e * inv - y) * (g4[0, 0, 0, 0] / nrows)

    return step


# --- integer ops --------------------------------------------------------------------------


@compiler(Op.ARGMAX)
def _argmax(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, d = srcs[0].array4d()[0, 0], node.array4d()[0, 0, 0]
    last = a.shape[1] - 1

    def step() -> None:
        d[...] = last - xp.argmax(a[:, ::-1], axis=1)  # ggml keeps the last maximum

    return step


@compiler(Op.COUNT_EQUAL)
def _count_equal(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, b, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()

    def step() -> None:
        d[...] = xp.sum(a == b, dtype=xp.int64)

    return step


# --- matrix products ----------------------------------------------------------------------


@compiler(Op.MUL_MAT)
def _mul_mat(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    # Per 2-D slice: C (N, M) = B (N, K) @ A (M, K).T
    xp = be.xp
    a, b, c = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    ga, gb = _batch_split(a.shape, b.shape)
    at = xp.swapaxes(split_axes(xp, a, ga + _whole(a)[2:]), -1, -2)
    b = split_axes(xp, b, gb + _whole(b)[2:])
    c = split_axes(xp, c, gb + _whole(c)[2:])
    return lambda: xp.matmul(b, at, out=c)


@compiler(Op.OUT_PROD)
def _out_prod(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    # Per 2-D slice: R (n1, n0) = B (K, n1).T @ A (K, n0)
    xp = be.xp
    a, b, c = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    ga, gb = _batch_split(a.shape, b.shape)
    a = split_axes(xp, a, ga + _whole(a)[2:])
    bt = xp.swapaxes(split_axes(xp, b, gb + _whole(b)[2:]), -1, -2)
    c = split_axes(xp, c, gb + _whole(c)[2:])
    return lambda: xp.matmul(bt, a, out=c)


# --- rows ---------------------------------------------------------------------------------


@compiler(Op.GET_ROWS)
def _get_rows(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    a, idx, d = srcs[0].array4d(), srcs[1].array4d()[0], node.array4d()
    pairs = [(a[i3, i2], idx[i3, i2], d[i3, i2])
             for i3 in range(d.shape[0]) for i2 in range(d.shape[1])]

    def step() -> None:
        check_row_indices("get_rows", idx, a.shape[2])
        for rows, ind, out in pairs:
            xp.take(rows, ind, axis=0, out=out)

    return step


@compiler(Op.GET_ROWS_BACK)
def _get_rows_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    g, idx, d = srcs[0].array4d()[0, 0], srcs[1].array4d()[0, 0, 0], node.array4d()[0, 0]

    def step() -> None:
        check_row_indices("get_rows_back", idx, d.shape[0])
        d[...] = 0
        be.scatter_add(d, idx, g)

    return step


# --- convolution and pooling --------------------------------------------------------------


def _padded_source(xp, x, p1: int, p0: int, need_h: int, need_w: int, fill: float):
    """``(src, load)``: ``x`` (N, C, H, W) placed at ``(p1, p0)`` in a persistent array filled
    with ``fill`` that covers ``need_h`` x ``need_w``, and the step refreshing it; ``(x, None)``
    when ``x`` covers every window without padding."""
    n, c, h, w = x.shape
    if p0 == 0 and p1 == 0 and need_h <= h and need_w <= w:
        return x, None
    buf = xp.full((n, c, max(need_h, h + p1), max(need_w, w + p0)), fill, dtype=xp.float32)
    inner = buf[:, :, p1:p1 + h, p0:p0 + w]

    def load() -> None:
        inner[...] = x

    return buf, load


def _window(src, y0: int, x0: int, oh: int, ow: int, s1: int, s0: int):
    """The (N, C, oh, ow) view of ``src`` read by window offset ``(y0, x0)`` at stride ``s``."""
    return src[:, :, y0:y0 + (oh - 1) * s1 + 1:s1, x0:x0 + (ow - 1) * s0 + 1:s0]


@compiler(Op.IM2COL)
def _im2col(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    # d[n, oh, ow, (ic*KH + kh)*KW + kw] = x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]
    xp = be.xp
    k, x, d = srcs[0], srcs[1].array4d(), node.array4d()
    kw_, kh_ = k.ne[0], k.ne[1]
    s0, s1, p0, p1, d0, d1 = node.op_params
    n, ic, _, _ = x.shape
    _, oh, ow, _ = d.shape
    d6 = split_axes(xp, d, [(n,), (oh,), (ow,), (ic, kh_, kw_)])
    src, load = _padded_source(xp, x, p1, p0, (oh - 1) * s1 + (kh_ - 1) * d1 + 1,
                               (ow - 1) * s0 + (kw_ - 1) * d0 + 1, 0.0)
    pairs = [(d6[:, :, :, :, kh, kw],
              _window(src, kh * d1, kw * d0, oh, ow, s1, s0).transpose(0, 2, 3, 1))
             for kh in range(kh_) for kw in range(kw_)]

    def step() -> None:
        if load is not None:
            load()
        for out, win in pairs:
            out[...] = win

    return step


@compiler(Op.IM2COL_BACK)
def _im2col_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    # every input pixel receives the sum of the g entries im2col read it into
    xp = be.xp
    g, k, d = srcs[0].array4d(), srcs[1], node.array4d()
    kw_, kh_ = k.ne[0], k.ne[1]
    s0, s1, p0, p1, d0, d1 = node.op_params
    n, ic, ih, iw = d.shape
    _, oh, ow, _ = g.shape
    g6 = split_axes(xp, g, [(n,), (oh,), (ow,), (ic, kh_, kw_)])
    need_h = (oh - 1) * s1 + (kh_ - 1) * d1 + 1
    need_w = (ow - 1) * s0 + (kw_ - 1) * d0 + 1
    direct = p0 == 0 and p1 == 0 and need_h <= ih and need_w <= iw
    acc = d if direct else xp.zeros((n, ic, max(need_h, ih + p1), max(need_w, iw + p0)),
                                    dtype=xp.float32)
    inner = acc[:, :, p1:p1 + ih, p0:p0 + iw]
    pairs = [(_window(acc, kh * d1, kw * d0, oh, ow, s1, s0),
              g6[:, :, :, :, kh, kw].transpose(0, 3, 1, 2))
             for kh in range(kh_) for kw in range(kw_)]

    def step() -> None:
        acc[...] = 0
        for win, part in pairs:
            xp.add(win, part, out=win)
        if not direct:
            d[...] = inner

    return step


def _pool_geometry(node: Tensor, out_shape):
    op, k0, k1, s0, s1, p0, p1 = node.op_params
    oh, ow = out_shape[2], out_shape[3]
    offsets = [(ky, kx) for ky in range(k1) for kx in range(k0)]
    return op, k0 * k1, offsets, (s0, s1, p0, p1), (oh - 1) * s1 + k1, (ow - 1) * s0 + k0


@compiler(Op.POOL_2D)
def _pool_2d(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    x, d = srcs[0].array4d(), node.array4d()
    op, area, offsets, (s0, s1, p0, p1), need_h, need_w = _pool_geometry(node, d.shape)
    oh, ow = d.shape[2], d.shape[3]
    is_max = op == OP_POOL_MAX
    # MAX starts at -FLT_MAX and skips padding (the fill never wins); NaN never wins (fmax)
    src, load = _padded_source(xp, x, p1, p0, need_h, need_w, -FLT_MAX if is_max else 0.0)
    wins = [_window(src, ky, kx, oh, ow, s1, s0) for ky, kx in offsets]
    area = F32(area)

    def step() -> None:
        if load is not None:
            load()
        if is_max:
            d[...] = -FLT_MAX
            for win in wins:
                xp.fmax(d, win, out=d)
        else:
            d[...] = 0  # AVG always divides by k0*k1, padding included
            for win in wins:
                xp.add(d, win, out=d)
            xp.divide(d, area, out=d)

    return step


@compiler(Op.POOL_2D_BACK)
def _pool_2d_back(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    xp = be.xp
    g, x, d = srcs[0].array4d(), srcs[1].array4d(), node.array4d()
    op, area, offsets, (s0, s1, p0, p1), need_h, need_w = _pool_geometry(node, g.shape)
    n, c, ih, iw = d.shape
    oh, ow = g.shape[2], g.shape[3]
    acc = xp.zeros((n, c, max(need_h, ih + p1), max(need_w, iw + p0)), dtype=xp.float32)
    inner = acc[:, :, p1:p1 + ih, p0:p0 + iw]
    acc_wins = [_window(acc, ky, kx, oh, ow, s1, s0) for ky, kx in offsets]

    if op != OP_POOL_MAX:
        gk = xp.empty(g.shape, dtype=xp.float32)
        area = F32(area)

        def step() -> None:
            xp.divide(g, area, out=gk)
            acc[...] = 0
            for win in acc_wins:
                xp.add(win, gk, out=win)
            d[...] = inner

        return step

    src, load = _padded_source(xp, x, p1, p0, need_h, need_w, -FLT_MAX)
    x_wins = [_window(src, ky, kx, oh, ow, s1, s0) for ky, kx in offsets]
    best = xp.empty(g.shape, dtype=xp.float32)
    arg = xp.empty(g.shape, dtype=xp.int32)
    take = xp.empty(g.shape, dtype=xp.bool_)

    def step() -> None:
        if load is not None:
            load()
        # the first strict maximum in scan order (ky outer, kx inner); -1: none beat -FLT_MAX
        best[...] = -FLT_MAX
        arg[...] = -1
        for j, win in enumerate(x_wins):
            xp.greater(win, best, out=take)
            xp.copyto(best, win, where=take)
            xp.copyto(arg, np.int32(j), where=take)
        acc[...] = 0
        for j, win in enumerate(acc_wins):
            xp.add(win, xp.where(arg == j, g, F32(0)), out=win)
        d[...] = inner

    return step


# --- optimizer steps (spec §2.10), in place into the parameter, m and v -------------------


@compiler(Op.OPT_STEP_ADAMW)
def _adamw(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    w, g, m, v, p4 = (s.array4d() for s in srcs)

    def step() -> None:
        alpha, b1, b2, eps, wd, b1h, b2h = p4.reshape(-1)[:7]
        m[...] = m * b1 + g * (F32(1) - b1)
        v[...] = v * b2 + g * g * (F32(1) - b2)
        mh = m * b1h
        vh = be.xp.sqrt(v * b2h) + eps
        w[...] = w * (F32(1) - alpha * wd) - alpha * mh / vh

    return step


@compiler(Op.OPT_STEP_SGD)
def _sgd(be: ArrayBackend, node: Tensor, srcs: tuple) -> Step:
    w, g, p4 = (s.array4d() for s in srcs)

    def step() -> None:
        alpha, wd = p4.reshape(-1)[:2]
        w[...] = w * (F32(1) - alpha * wd) - alpha * g

    return step


from . import xp_tfm  # noqa: E402,F401 - registers the transformer ops' compilers
