"""For the ggml-order tests: 2-D calls of the 4-D kernels, exact ``fmaf`` and ``hsum_float_8``
in NumPy."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ggopt._kernels import _ggml_order as go

f32 = np.float32


def softmax(x, mask, out, scale, n_threads, padded=False) -> None:
    """``_ggml_order.soft_max_rows`` on 2-D rows."""
    go.soft_max_rows(x[None, None], None if mask is None else mask[None, None], out[None, None],
                     scale, n_threads, padded)


def mm_f32(a, b, out, tiny, n_threads) -> None:
    """``_ggml_order.mul_mat_f32`` on 2-D operands."""
    go.mul_mat_f32(a[None, None], b[None, None], out[None, None], tiny, n_threads)


def fma(a, b, c) -> np.ndarray:
    """fmaf elementwise: a*b is exact in double; a double sum that lands on a float32 midpoint
    (the one case where rounding twice differs) is redone exactly."""
    a, b, c = np.broadcast_arrays(np.asarray(a, f32), np.asarray(b, f32), np.asarray(c, f32))
    shape = a.shape
    a, b, c = (np.atleast_1d(v) for v in (a, b, c))
    with np.errstate(all="ignore"):
        r = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
        out = r.astype(f32)
        lo = np.nextafter(out, f32(-np.inf)).astype(np.float64)
        hi = np.nextafter(out, f32(np.inf)).astype(np.float64)
        mid = np.isfinite(r) & ((r == (lo + out) / 2) | (r == (hi + out) / 2))
    for i in zip(*np.nonzero(mid)):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        cands = sorted({out[i], np.nextafter(out[i], f32(-np.inf)),
                        np.nextafter(out[i], f32(np.inf))},
                       key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(np.int32)) & 1))
        out[i] = cands[0]
    return out.reshape(shape)


def hsum8(v: np.ndarray) -> np.float32:
    r = [f32(v[k + 4] + v[k]) for k in range(4)]
    return f32(f32(r[0] + r[2]) + f32(r[1] + r[3]))
