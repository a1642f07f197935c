"""im2col and its adjoint by direct gather/scatter, for windows far apart or deep in padding.

The OpenMP kernels copy the input into a zero-padded scratch strip (per thread) that spans
every window; with a huge stride or padding (2**31 - 1 and 2**30 on an 8x8 image) that strip
would take tens of GiB for a few output values. These NumPy versions need memory in proportion
to the output only; the CPU backend picks them when the strip would be far larger than the data.
"""

from __future__ import annotations

import numpy as np

__all__ = ["im2col_scratch", "im2col_gather", "im2col_back_scatter", "prefer_sparse"]


def _padded_extent(size: int, pad: int, n_out: int, stride: int, k: int, dil: int) -> int:
    return max((n_out - 1) * stride + (k - 1) * dil + 1, size + pad)


#: ``(s0, s1, p0, p1, d0, d1)``: strides, paddings and dilations
Geometry = tuple[int, int, int, int, int, int]
Shape = tuple[int, ...]


def im2col_scratch(x_shape: Shape, d_shape: Shape, KH: int, KW: int, prm: Geometry,
                   n_threads: int, back: bool) -> int:
    """Floats of scratch the OpenMP kernel allocates (``_conv.pyx``'s strip or padded image)."""
    s0, s1, p0, p1, d0, d1 = prm
    N, IC, IH, IW = x_shape
    OH, OW = d_shape[1], d_shape[2]
    PW = _padded_extent(IW, p0, OW, s0, KW, d0)
    if back:
        return int(max(n_threads, 1) * IC * _padded_extent(IH, p1, OH, s1, KH, d1) * PW)
    return int(max(n_threads, 1) * IC * KH * PW)


def prefer_sparse(scratch: int, x_size: int, d_size: int) -> bool:
    """True when the kernel's scratch would dwarf the data (more than 16 MiB and 8x the data)."""
    return scratch > max(1 << 22, 8 * (x_size + d_size))


def _indices(n_out: int, stride: int, k: int, dil: int, pad: int, size: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """Input coordinates (n_out, k) of every window tap, clipped, and whether each is inside."""
    pos = np.arange(n_out, dtype=np.int64)[:, None] * stride + \
        np.arange(k, dtype=np.int64)[None, :] * dil - pad
    inside = (pos >= 0) & (pos < size)
    return np.where(inside, pos, 0), inside


def _taps(x_shape: Shape, d_shape: Shape, KH: int, KW: int, prm: Geometry
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s0, s1, p0, p1, d0, d1 = prm
    _, IC, IH, IW = x_shape
    OH, OW = d_shape[1], d_shape[2]
    iy, in_y = _indices(OH, s1, KH, d1, p1, IH)  # (OH, KH)
    ix, in_x = _indices(OW, s0, KW, d0, p0, IW)  # (OW, KW)
    # broadcast to (OH, OW, IC, KH, KW)
    ic = np.arange(IC)[None, None, :, None, None]
    yy = iy[:, None, None, :, None]
    xx = ix[None, :, None, None, :]
    inside = in_y[:, None, None, :, None] & in_x[None, :, None, None, :]
    return ic, yy, xx, inside


def im2col_gather(x: np.ndarray, d: np.ndarray, KH: int, KW: int, prm: Geometry) -> None:
    """``d`` (N, OH, OW, IC*KH*KW) = the windows of ``x`` (N, IC, IH, IW), 0 outside ``x``."""
    N, OH, OW, K = d.shape
    if d.size == 0:
        return
    if x.size == 0:
        d.fill(0.0)
        return
    ic, yy, xx, inside = _taps(x.shape, d.shape, KH, KW, prm)
    for n in range(N):
        vals = x[n][ic, yy, xx]  # (OH, OW, IC, KH, KW)
        d[n] = np.where(inside, vals, np.float32(0)).reshape(OH, OW, K)


def im2col_back_scatter(g: np.ndarray, d: np.ndarray, KH: int, KW: int,
                        prm: Geometry) -> None:
    """``d`` (N, IC, IH, IW) = the sum of the ``g`` (N, OH, OW, IC*KH*KW) entries read from
    each pixel: the adjoint of :func:`im2col_gather`."""
    N, IC, IH, IW = d.shape
    if d.size == 0:
        return
    d.fill(0.0)
    if g.size == 0:
        return
    OH, OW = g.shape[1], g.shape[2]
    ic, yy, xx, inside = _taps(d.shape, g.shape, KH, KW, prm)
    shape = (OH, OW, IC, KH, KW)
    ic_b, yy_b, xx_b, in_b = (np.broadcast_to(a, shape) for a in (ic, yy, xx, inside))
    for n in range(N):
        vals = g[n].reshape(shape)
        np.add.at(d[n], (ic_b[in_b], yy_b[in_b], xx_b[in_b]), vals[in_b])
