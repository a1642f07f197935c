"""get_rows and get_rows_back kernels against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _get_rows as kernels

THREADS = [1, 2]


def _strided(a: np.ndarray) -> np.ndarray:
    """An array equal to ``a`` whose last axis has a step of two elements."""
    base = np.full(a.shape[:-1] + (2 * a.shape[-1],), -1, a.dtype)
    base[..., ::2] = a
    return base[..., ::2]


def _layout(a: np.ndarray, kind: str) -> np.ndarray:
    if kind == "contiguous":
        return np.ascontiguousarray(a)
    if kind == "strided":
        return _strided(a)
    if kind == "transposed":
        return np.asfortranarray(a)
    if kind == "readonly":
        b = a.copy()
        b.setflags(write=False)
        return b
    raise ValueError(kind)


def get_rows_ref(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    i2 = np.arange(idx.shape[0])[:, None, None]
    i1 = np.arange(idx.shape[1])[None, :, None]
    return a[i2, i1, idx]


def get_rows_back_ref(g: np.ndarray, idx: np.ndarray, nrows: int) -> np.ndarray:
    out = np.zeros((nrows, g.shape[1]))
    np.add.at(out, idx, g.astype(np.float64))
    return out


def _get_rows(a, idx, n_threads):
    dst = np.full(idx.shape + (a.shape[3],), np.nan, np.float32)
    kernels.get_rows(a, idx, dst, n_threads)
    return dst


def _get_rows_back(g, idx, nrows, n_threads):
    dst = np.full((nrows, g.shape[1]), np.nan, np.float32)
    kernels.get_rows_back(g, idx, dst, n_threads)
    return dst


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize(
    ("a_shape", "n_idx"),
    [((1, 1, 7, 5), 11), ((2, 3, 7, 5), 4), ((1, 1, 50, 1), 3), ((2, 2, 300, 70), 250)],
)
def test_get_rows_matches_reference(a_shape, n_idx, n_threads):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    idx = rng.integers(0, a_shape[2], (a_shape[0], a_shape[1], n_idx)).astype(np.int32)
    np.testing.assert_array_equal(_get_rows(a, idx, n_threads), get_rows_ref(a, idx))


@pytest.mark.parametrize("a_layout", ["contiguous", "strided", "transposed", "readonly"])
@pytest.mark.parametrize("idx_layout", ["contiguous", "strided", "transposed", "readonly"])
def test_get_rows_any_strides(a_layout, idx_layout):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 9, 6)).astype(np.float32)
    idx = rng.integers(0, 9, (2, 3, 5)).astype(np.int32)
    got = _get_rows(_layout(a, a_layout), _layout(idx, idx_layout), 2)
    np.testing.assert_array_equal(got, get_rows_ref(a, idx))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize(
    ("n", "nrows", "ne0"), [(20, 7, 1), (13, 5, 5), (200, 9, 37), (400, 50, 300)]
)
def test_get_rows_back_accumulates_repeated_indices(n, nrows, ne0, n_threads):
    rng = np.random.default_rng(2)
    g = rng.standard_normal((n, ne0)).astype(np.float32)
    # Leave the last row unreferenced: it must come back zero, not as the NaN prefill.
    idx = rng.integers(0, nrows - 1, n).astype(np.int32)
    idx[:3] = 0
    got = _get_rows_back(g, idx, nrows, n_threads)
    np.testing.assert_allclose(got, get_rows_back_ref(g, idx, nrows), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[-1], 0.0)


@pytest.mark.parametrize("g_layout", ["contiguous", "strided", "transposed", "readonly"])
@pytest.mark.parametrize("idx_layout", ["contiguous", "strided", "readonly"])
def test_get_rows_back_any_strides(g_layout, idx_layout):
    rng = np.random.default_rng(3)
    g = rng.standard_normal((30, 40)).astype(np.float32)
    idx = rng.integers(0, 6, 30).astype(np.int32)
    got = _get_rows_back(_layout(g, g_layout), _layout(idx, idx_layout), 6, 2)
    np.testing.assert_allclose(got, get_rows_back_ref(g, idx, 6), rtol=1e-5, atol=1e-5)


def test_get_rows_back_result_does_not_depend_on_thread_count():
    rng = np.random.default_rng(4)
    g = rng.standard_normal((500, 129)).astype(np.float32)
    idx = rng.integers(0, 8, 500).astype(np.int32)
    one = _get_rows_back(g, idx, 8, 1)
    np.testing.assert_array_equal(_get_rows_back(g, idx, 8, 2), one)


def test_get_rows_back_without_rows_zeroes_dst():
    got = _get_rows_back(np.empty((0, 4), np.float32), np.empty(0, np.int32), 3, 2)
    np.testing.assert_array_equal(got, np.zeros((3, 4), np.float32))


def test_get_rows_back_is_adjoint_of_get_rows():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 1, 12, 7)).astype(np.float32)
    idx = rng.integers(0, 12, (1, 1, 20)).astype(np.int32)
    rows = _get_rows(a, idx, 2)
    g = rng.standard_normal(rows.shape).astype(np.float32)
    back = _get_rows_back(g[0, 0], idx[0, 0], 12, 2)
    lhs = np.vdot(rows.astype(np.float64), g.astype(np.float64))
    rhs = np.vdot(a[0, 0].astype(np.float64), back.astype(np.float64))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5)
