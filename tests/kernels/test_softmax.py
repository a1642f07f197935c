"""ggopt._kernels._softmax against float64 NumPy: softmax, its backward, cross-entropy loss."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _softmax as S
from ggopt.errors import ShapeError
from tests.support.helpers import layout
from tests.support.sizes import KERNEL_BIG

SHAPE = (7, 13, 3, 5)
BIG = KERNEL_BIG  # 270,000 elements: enough for the kernels to start threads
THREADS = [1, 2]


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ce_ref(logits: np.ndarray, labels: np.ndarray) -> float:
    x = logits.astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    return float(-(labels * lsm).sum() / x.shape[0])


def batch(rng: np.random.Generator, nrows: int, ncols: int, soft: bool = False):
    logits = (rng.standard_normal((nrows, ncols)) * 4).astype(np.float32)
    if soft:
        labels = rng.random((nrows, ncols)).astype(np.float32)
        labels /= labels.sum(axis=1, keepdims=True)
    else:
        labels = np.zeros((nrows, ncols), np.float32)
        labels[np.arange(nrows), rng.integers(0, ncols, nrows)] = 1
    return logits, labels


LAYOUTS_4D = ["contiguous", "strided", "permuted", "padded_rows", "reversed", "readonly"]


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG, (1, 1, 2, 3000)])
@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_soft_max(rng, shape, scale, n_threads):
    a = (rng.standard_normal(shape) * 5).astype(np.float32)
    expect = softmax_ref(np.float32(scale) * a)
    for la in LAYOUTS_4D:
        dst = layout(np.zeros(shape, np.float32), "strided" if la == "readonly" else "contiguous")
        S.soft_max(layout(a, la), dst, scale, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=2e-6, atol=1e-8)


def test_soft_max_in_place_and_extremes():
    a = np.array([[1000.0, 1001.0, -np.inf, 999.0], [0, 0, 0, 0]], np.float32).reshape(1, 1, 2, 4)
    expect = softmax_ref(a)
    for view in (a.copy(), layout(a, "strided"), layout(a, "reversed")):
        S.soft_max(view, view, 1.0, 1)
        np.testing.assert_allclose(view, expect, rtol=2e-6)
        assert view[0, 0, 0, 2] == 0


def test_soft_max_errors():
    narrow = np.full((7, 13, 3, 4), 7, np.float32)
    with pytest.raises(ShapeError, match="dst"):
        S.soft_max(np.zeros(SHAPE, np.float32), narrow, 1.0, 1)
    np.testing.assert_array_equal(narrow, 7)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_soft_max_back(rng, shape, scale, n_threads):
    y = softmax_ref(rng.standard_normal(shape)).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    y64, g64 = y.astype(np.float64), g.astype(np.float64)
    expect = scale * y64 * (g64 - (g64 * y64).sum(axis=-1, keepdims=True))
    for lg, ly in [("contiguous", "contiguous"), ("strided", "permuted"), ("reversed", "readonly")]:
        dst = np.zeros(shape, np.float32)
        S.soft_max_back(layout(g, lg), layout(y, ly), dst, scale, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=1e-5, atol=1e-7)
    S.soft_max_back(g, y, g, scale, n_threads)  # dst is g
    np.testing.assert_allclose(g, expect, rtol=1e-5, atol=1e-7)


def test_soft_max_back_errors():
    a = np.zeros(SHAPE, np.float32)
    dst = np.full(SHAPE, 7, np.float32)
    with pytest.raises(ShapeError, match="y"):
        S.soft_max_back(a, a[..., :4], dst, 1.0, 1)
    np.testing.assert_array_equal(dst, 7)
    np.testing.assert_array_equal(a, 0)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("nrows,ncols", [(500, 10), (37, 13), (3, 5000), (4000, 10)])
@pytest.mark.parametrize("soft", [False, True])
def test_cross_entropy_loss(rng, nrows, ncols, soft, n_threads):
    logits, labels = batch(rng, nrows, ncols, soft)
    expect = ce_ref(logits, labels)
    for lx, ly in [
        ("contiguous", "contiguous"),
        ("padded_rows", "readonly"),
        ("strided", "permuted"),
    ]:
        got = S.cross_entropy_loss(layout(logits, lx), layout(labels, ly), n_threads)
        assert isinstance(got, float) and float(np.float32(got)) == got
        np.testing.assert_allclose(got, expect, rtol=2e-6)


def test_cross_entropy_loss_errors():
    a = np.zeros((4, 3), np.float32)
    with pytest.raises(ShapeError, match="labels"):
        S.cross_entropy_loss(a, a[:, :2], 1)
    with pytest.raises(ShapeError, match="no rows"):
        S.cross_entropy_loss(a[:0], a[:0], 1)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("nrows,ncols", [(500, 10), (37, 13), (3, 5000), (4000, 10)])
def test_cross_entropy_loss_back(rng, nrows, ncols, n_threads):
    logits, labels = batch(rng, nrows, ncols, soft=True)
    grad = 0.75
    expect = (softmax_ref(logits) - labels) * (grad / nrows)
    for lx, ly, ld in [
        ("contiguous", "contiguous", "contiguous"),
        ("padded_rows", "readonly", "strided"),
        ("strided", "permuted", "reversed"),
    ]:
        dst = layout(np.zeros((nrows, ncols), np.float32), ld)
        S.cross_entropy_loss_back(grad, layout(logits, lx), layout(labels, ly), dst, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("alias", ["logits", "labels"])
@pytest.mark.parametrize("kind", ["contiguous", "strided"])
def test_cross_entropy_loss_back_in_place(rng, alias, kind):
    logits, labels = batch(rng, 50, 10, soft=True)
    expect = (softmax_ref(logits) - labels) / 50
    x, y = layout(logits, kind), layout(labels, kind)
    dst = x if alias == "logits" else y
    S.cross_entropy_loss_back(1.0, x, y, dst, 1)
    np.testing.assert_allclose(dst, expect, rtol=1e-5, atol=1e-9)


def test_cross_entropy_loss_back_errors():
    a = np.zeros((4, 3), np.float32)
    dst = np.full((4, 2), 3, np.float32)
    with pytest.raises(ShapeError, match="dst"):
        S.cross_entropy_loss_back(1.0, a, a, dst, 1)
    np.testing.assert_array_equal(dst, 3)
