"""Convolution and pooling array compilers: shifted strided windows, no Python loops per pixel.

im2col and the convolutions read and write only the in-image part of each window (no padded
copy of the input), so paddings, strides and dilations far beyond the image cost no memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....errors import OutOfMemoryError
from ....ops._base import params_of
from ....ops.conv import OP_POOL_MAX, Conv2DParams, Im2ColParams, PoolParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs, split_axes

if TYPE_CHECKING:
    from ..backend import ArrayBackend


FLT_MAX = F32(np.finfo(np.float32).max)
#: Pooling's padded copy of its input may always take this many bytes (or 16x the input).
_PAD_LIMIT = 1 << 30


def _padded_source(xp: Any, x: Any, p1: int, p0: int, need_h: int, need_w: int,
                   fill: float) -> tuple[Any, Step | None]:
    """``(src, load)``: ``x`` (N, C, H, W) placed at ``(p1, p0)`` in a persistent array filled
    with ``fill`` that covers ``need_h`` x ``need_w``, and the step refreshing it; ``(x, None)``
    when ``x`` covers every window without padding."""
    n, c, h, w = x.shape
    if p0 == 0 and p1 == 0 and need_h <= h and need_w <= w:
        return x, None
    shape = (n, c, max(need_h, h + p1), max(need_w, w + p0))
    nbytes = 4 * n * c * shape[2] * shape[3]
    if nbytes > max(_PAD_LIMIT, 16 * 4 * x.size):
        raise OutOfMemoryError(
            f"pooling on {xp.__name__}: padding (p0={p0}, p1={p1}) and the windows need a padded "
            f"copy of the input of shape {shape} ({nbytes / 2**30:.3g} GiB), more than 16x the "
            "input and 1 GiB; the CPU backend pools without one")
    try:
        buf = xp.full(shape, fill, dtype=xp.float32)
    except MemoryError as e:
        raise OutOfMemoryError(f"pooling on {xp.__name__}: no memory for a padded copy of the "
                               f"input of shape {shape}") from e
    inner = buf[:, :, p1:p1 + h, p0:p0 + w]

    def load() -> None:
        inner[...] = x

    return buf, load


def _window(src: Any, y0: int, x0: int, oh: int, ow: int, s1: int, s0: int) -> Any:
    """The (N, C, oh, ow) view of ``src`` read by window offset ``(y0, x0)`` at stride ``s``."""
    return src[:, :, y0:y0 + (oh - 1) * s1 + 1:s1, x0:x0 + (ow - 1) * s0 + 1:s0]


Geometry = tuple[int, int, int, int, int, int]


def _span(n_out: int, off: int, s: int, size: int) -> tuple[slice, slice]:
    """For a window tap at offset ``off`` (``k*d - p``) and stride ``s``: the output indices
    ``o < n_out`` that read inside an axis of ``size`` (``0 <= o*s + off < size``, a range),
    and the input positions they read. Only these are touched, so no padded copy of the
    input is made (paddings and dilations may be far larger than the image)."""
    lo = max(0, -(off // s))
    hi = min(n_out, (size - 1 - off) // s + 1) if size - 1 - off >= 0 else 0
    if hi <= lo:
        return slice(0, 0), slice(0, 0)
    return slice(lo, hi), slice(lo * s + off, (hi - 1) * s + off + 1, s)


def _unfolder(xp: Any, x: Any, d6: Any, kh_: int, kw_: int, geom: Geometry) -> Step:
    """The step that fills ``d6`` (N, OH, OW, IC, KH, KW) with the windows of ``x`` (N, IC,
    IH, IW): ``d6[n, oh, ow, ic, kh, kw] = x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]``,
    0 outside ``x``."""
    s0, s1, p0, p1, d0, d1 = geom
    oh, ow = d6.shape[1], d6.shape[2]
    ih, iw = x.shape[2], x.shape[3]
    pairs = []
    zeros = []
    for kh in range(kh_):
        for kw in range(kw_):
            out = d6[:, :, :, :, kh, kw]
            (oy, iy), (ox, ix) = _span(oh, kh * d1 - p1, s1, ih), _span(ow, kw * d0 - p0, s0, iw)
            if oy.stop == oy.start or ox.stop == ox.start:
                zeros.append(out)
                continue
            pairs.append((out[:, oy, ox], x[:, :, iy, ix].transpose(0, 2, 3, 1)))
            zeros += [out[:, :oy.start], out[:, oy.stop:], out[:, oy, :ox.start],
                      out[:, oy, ox.stop:]]
    zeros = [z for z in zeros if z.size]

    def step() -> None:
        for z in zeros:
            z[...] = 0
        for out, win in pairs:
            out[...] = win

    return step


def _folder(xp: Any, d: Any, part: Any, kh_: int, kw_: int, geom: Geometry) -> Step:
    """The step that writes into ``d`` (N, IC, IH, IW) the adjoint of :func:`_unfolder`:
    every pixel gets the sum of the entries of ``part(kh, kw)`` (N, IC, OH, OW) read from
    it."""
    s0, s1, p0, p1, d0, d1 = geom
    ih, iw = d.shape[2], d.shape[3]
    oh, ow = part(0, 0).shape[2:]
    pairs = []
    for kh in range(kh_):
        for kw in range(kw_):
            (oy, iy), (ox, ix) = _span(oh, kh * d1 - p1, s1, ih), _span(ow, kw * d0 - p0, s0, iw)
            if oy.stop > oy.start and ox.stop > ox.start:
                pairs.append((d[:, :, iy, ix], part(kh, kw)[:, :, oy, ox]))

    def step() -> None:
        d[...] = 0
        for win, contribution in pairs:
            xp.add(win, contribution, out=win)

    return step


@COMPILERS.register(Op.IM2COL)
def _im2col(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    k, x, d = srcs[0], mem(srcs[1]), mem(node)
    kw_, kh_ = k.ne[0], k.ne[1]
    n, ic, _, _ = x.shape
    _, oh, ow, _ = d.shape
    d6 = split_axes(be.xp, d, [(n,), (oh,), (ow,), (ic, kh_, kw_)])
    return _unfolder(be.xp, x, d6, kh_, kw_, _geometry(params_of(node, Im2ColParams)))


@COMPILERS.register(Op.IM2COL_BACK)
def _im2col_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, k, d = mem(srcs[0]), srcs[1], mem(node)
    kw_, kh_ = k.ne[0], k.ne[1]
    n, ic, _, _ = d.shape
    _, oh, ow, _ = g.shape
    g6 = split_axes(be.xp, g, [(n,), (oh,), (ow,), (ic, kh_, kw_)])
    return _folder(be.xp, d, lambda kh, kw: g6[:, :, :, :, kh, kw].transpose(0, 3, 1, 2),
                   kh_, kw_, _geometry(params_of(node, Im2ColParams)))


def _conv_geometry(node: Tensor) -> Geometry:
    p = params_of(node, Conv2DParams)
    return p.s0, p.s1, p.p0, p.p1, p.d0, p.d1


def _patches(xp: Any, x: Any, k_ne: tuple[int, ...], oh: int, ow: int,
             geom: Geometry) -> tuple[Any, Step]:
    """A patch array (N, OH*OW, IC*KH*KW) of ``x`` and the step filling it."""
    n, ic = x.shape[0], x.shape[1]
    kw_, kh_ = k_ne[0], k_ne[1]
    cols = xp.empty((n, oh, ow, ic, kh_, kw_), dtype=xp.float32)
    return cols.reshape(n, oh * ow, ic * kh_ * kw_), _unfolder(xp, x, cols, kh_, kw_, geom)


@COMPILERS.register(Op.CONV_2D)
def _conv_2d(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    # d[n, oc, m] = sum_k kernel[oc, k] * patches[n, m, k]
    xp = be.xp
    k, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    n, oc, oh, ow = d.shape
    cols, unfold = _patches(xp, x, srcs[0].ne, oh, ow, _conv_geometry(node))
    d3 = d.reshape(n, oc, oh * ow)

    def step() -> None:
        unfold()
        xp.matmul(k.reshape(oc, -1), cols.transpose(0, 2, 1), out=d3)

    return step


@COMPILERS.register(Op.CONV_2D_BACK_INPUT)
def _conv_2d_back_input(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    # the patch gradient kernel^T @ g, folded back onto the image
    xp = be.xp
    k, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    n, oc, oh, ow = g.shape
    ic, kh_, kw_ = k.shape[1], k.shape[2], k.shape[3]
    dcols = xp.empty((n, ic * kh_ * kw_, oh * ow), dtype=xp.float32)
    d6 = dcols.reshape(n, ic, kh_, kw_, oh, ow)
    fold = _folder(xp, d, lambda kh, kw: d6[:, :, kh, kw], kh_, kw_, _conv_geometry(node))

    def step() -> None:
        xp.matmul(k.reshape(oc, -1).T, g.reshape(n, oc, oh * ow), out=dcols)
        fold()

    return step


@COMPILERS.register(Op.CONV_2D_BACK_KERNEL)
def _conv_2d_back_kernel(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    # d[oc, k] = sum over n, m of g[n, oc, m] * patches[n, m, k]
    xp = be.xp
    x, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    n, oc, oh, ow = g.shape
    cols, unfold = _patches(xp, x, node.ne, oh, ow, _conv_geometry(node))
    d2 = d.reshape(oc, -1)

    def step() -> None:
        unfold()
        d2[...] = xp.tensordot(g.reshape(n, oc, oh * ow), cols, axes=([0, 2], [0, 1]))

    return step


def _pool_geometry(node: Tensor, out_shape: tuple[int, ...]) -> tuple[
        int, int, list[tuple[int, int]], tuple[int, int, int, int], int, int]:
    p = params_of(node, PoolParams)
    oh, ow = out_shape[2], out_shape[3]
    offsets = [(ky, kx) for ky in range(p.k1) for kx in range(p.k0)]
    return (p.op, p.k0 * p.k1, offsets, (p.s0, p.s1, p.p0, p.p1), (oh - 1) * p.s1 + p.k1,
            (ow - 1) * p.s0 + p.k0)


@COMPILERS.register(Op.POOL_2D)
def _pool_2d(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    x, d = mem(srcs[0]), mem(node)
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


@COMPILERS.register(Op.POOL_2D_BACK)
def _pool_2d_back(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    op, area, offsets, (s0, s1, p0, p1), need_h, need_w = _pool_geometry(node, g.shape)
    n, c, ih, iw = d.shape
    oh, ow = g.shape[2], g.shape[3]
    acc = xp.zeros((n, c, max(need_h, ih + p1), max(need_w, iw + p0)), dtype=xp.float32)
    inner = acc[:, :, p1:p1 + ih, p0:p0 + iw]
    acc_wins = [_window(acc, ky, kx, oh, ow, s1, s0) for ky, kx in offsets]

    if op != OP_POOL_MAX:
        gk = xp.empty(g.shape, dtype=xp.float32)
        area = F32(area)

        def avg_step() -> None:
            xp.divide(g, area, out=gk)
            acc[...] = 0
            for win in acc_wins:
                xp.add(win, gk, out=win)
            d[...] = inner

        return avg_step

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


def _geometry(p: Im2ColParams) -> tuple[int, int, int, int, int, int]:
    return p.s0, p.s1, p.p0, p.p1, p.d0, p.d1
