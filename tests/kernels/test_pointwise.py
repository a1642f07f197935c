"""ggopt._kernels._pointwise against float64 NumPy: swiglu, sin, cos."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _pointwise as P
from ggopt.errors import ShapeError
from tests.support.helpers import layout

LAYOUTS = ["contiguous", "strided", "permuted", "padded_rows", "reversed", "readonly"]
SHAPES = [(2, 3, 5, 7), (1, 3, 100, 257), (1, 1, 1, 1)]


def silu64(x):
    x = x.astype(np.float64)
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu(rng, shape, n_threads):
    x0 = (rng.standard_normal(shape) * 4).astype(np.float32)
    x1 = rng.standard_normal(shape).astype(np.float32)
    want = silu64(x0) * x1
    for l0, l1 in [("contiguous", "contiguous"), ("strided", "permuted"),
                   ("reversed", "readonly"), ("padded_rows", "strided")]:
        dst = np.zeros(shape, np.float32)
        P.swiglu(layout(x0, l0), layout(x1, l1), dst, n_threads)
        np.testing.assert_allclose(dst, want, rtol=2e-6, atol=1e-7, err_msg=f"{l0}/{l1}")


def test_swiglu_halves_of_one_array(rng):
    # ggml_swiglu: the two halves of each row, as views of one array
    a = rng.standard_normal((2, 3, 4, 10)).astype(np.float32)
    dst = np.zeros((2, 3, 4, 5), np.float32)
    P.swiglu(a[..., :5], a[..., 5:], dst, 2)
    np.testing.assert_allclose(dst, silu64(a[..., :5]) * a[..., 5:], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fn,ref", [(P.sin, np.sin), (P.cos, np.cos)], ids=["sin", "cos"])
def test_sin_cos(rng, shape, fn, ref, n_threads):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    want = ref(x.astype(np.float64))
    for lay in LAYOUTS:
        dst = layout(np.zeros(shape, np.float32), "strided" if lay == "readonly" else "contiguous")
        fn(layout(x, lay), dst, n_threads)
        np.testing.assert_allclose(dst, want, rtol=1e-6, atol=1e-6, err_msg=lay)
    y = x.copy()
    fn(y, y, n_threads)  # in place
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_thread_count_does_not_change_bits(rng):
    x0, x1 = rng.standard_normal((2, 2, 100, 301)).astype(np.float32), \
        rng.standard_normal((2, 2, 100, 301)).astype(np.float32)
    outs = []
    for nt in (1, 2):
        d = np.empty_like(x0)
        P.swiglu(x0, x1, d, nt)
        outs.append(d)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_errors():
    a = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="x1"):
        P.swiglu(a, np.zeros((1, 2, 3, 5), np.float32), a.copy(), 1)
    with pytest.raises(ShapeError, match="dst"):
        P.sin(a, np.zeros((1, 2, 3, 5), np.float32), 1)
