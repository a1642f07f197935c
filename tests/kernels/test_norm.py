"""ggopt._kernels._norm against float64 NumPy: rms_norm, norm and their gradients."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _norm as N
from ggopt.errors import ShapeError
from tests.support.helpers import layout

SHAPES = [(2, 3, 5, 7), (1, 2, 130, 257), (1, 1, 1, 1)]
LAYOUTS = ["contiguous", "strided", "permuted", "padded_rows", "reversed", "readonly"]
EPS = 1e-5


def rms_norm_ref(x):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)


def norm_ref(x):
    x = x.astype(np.float64)
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + EPS)


def rms_norm_back_ref(g, x):
    """Vector-Jacobian product of rms_norm, written out from the definition."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    n = x.shape[-1]
    r = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)
    return r * g - x * r**3 * (x * g).sum(axis=-1, keepdims=True) / n


def norm_back_ref(g, x):
    x, g = x.astype(np.float64), g.astype(np.float64)
    c = x - x.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + EPS)
    xh = c * r
    return r * (g - g.mean(axis=-1, keepdims=True) - xh * (g * xh).mean(axis=-1, keepdims=True))


def _data(rng, shape, offset=0.0):
    return (rng.standard_normal(shape) * 2 + offset).astype(np.float32)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel,ref", [(N.rms_norm, rms_norm_ref), (N.norm, norm_ref)],
                         ids=["rms_norm", "norm"])
def test_forward(rng, shape, kernel, ref, n_threads):
    x = _data(rng, shape, offset=0.5)
    want = ref(x)
    for lay in LAYOUTS:
        dst = layout(np.zeros(shape, np.float32), "strided" if lay == "readonly" else "contiguous")
        kernel(layout(x, lay), dst, EPS, n_threads)
        np.testing.assert_allclose(dst, want, rtol=2e-5, atol=2e-5, err_msg=lay)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel,ref", [(N.rms_norm_back, rms_norm_back_ref),
                                        (N.norm_back, norm_back_ref)],
                         ids=["rms_norm_back", "norm_back"])
def test_backward(rng, shape, kernel, ref, n_threads):
    x, g = _data(rng, shape, offset=0.5), _data(rng, shape)
    want = ref(g, x)
    for lg, lx in [("contiguous", "contiguous"), ("strided", "permuted"),
                   ("reversed", "readonly"), ("padded_rows", "strided")]:
        dst = np.zeros(shape, np.float32)
        kernel(layout(g, lg), layout(x, lx), dst, EPS, n_threads)
        np.testing.assert_allclose(dst, want, rtol=1e-4, atol=1e-4, err_msg=f"{lg}/{lx}")


def test_thread_count_does_not_change_bits(rng):
    x, g = _data(rng, (2, 3, 130, 257), 0.5), _data(rng, (2, 3, 130, 257))
    for fwd, back in [(N.rms_norm, N.rms_norm_back), (N.norm, N.norm_back)]:
        outs = []
        for nt in (1, 2):
            y, dx = np.empty_like(x), np.empty_like(x)
            fwd(x, y, EPS, nt)
            back(g, x, dx, EPS, nt)
            outs.append((y, dx))
        np.testing.assert_array_equal(outs[0][0], outs[1][0])
        np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_in_place(rng):
    x, g = _data(rng, (2, 3, 4, 9), 0.5), _data(rng, (2, 3, 4, 9))
    y = x.copy()
    N.rms_norm(y, y, EPS, 1)
    np.testing.assert_allclose(y, rms_norm_ref(x), rtol=2e-5, atol=1e-6)
    for alias in ("g", "x"):
        gg, xx = g.copy(), x.copy()
        dst = gg if alias == "g" else xx
        N.norm_back(gg, xx, dst, EPS, 2)
        np.testing.assert_allclose(dst, norm_back_ref(g, x), rtol=1e-4, atol=1e-4)


def test_zero_rows_and_eps():
    # all-zero rows: rms_norm gives 0 (not NaN) thanks to eps; norm's gradient is finite
    x = np.zeros((1, 1, 2, 6), np.float32)
    y = np.full_like(x, 7)
    N.rms_norm(x, y, EPS, 1)
    assert (y == 0).all()
    dx = np.full_like(x, 7)
    N.norm_back(np.ones_like(x), x, dx, EPS, 1)
    np.testing.assert_allclose(dx, 0, atol=1e-6)


def test_shape_errors():
    x = np.zeros((2, 3, 4, 5), np.float32)
    with pytest.raises(ShapeError, match="dst"):
        N.rms_norm(x, np.zeros((2, 3, 4, 6), np.float32), EPS, 1)
    with pytest.raises(ShapeError, match="gradient"):
        N.rms_norm_back(np.zeros((2, 3, 5, 5), np.float32), x, x.copy(), EPS, 1)
