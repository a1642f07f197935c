"""Every op computed through a graph against a NumPy reference.

Odd sizes, ggml tiling broadcasts, non-contiguous inputs (transpose/permute/view results) and
1 and 2 threads. The ``LARGE`` sizes are derived from the parallel threshold in effect (see
tests/_threadcheck.py); tests/test_threads_reached.py proves that they start a second thread.
"""

from __future__ import annotations

import numpy as np
import pytest
from _threadcheck import large_2d
from helpers import assert_close, run, run1

import ggopt

pytestmark = pytest.mark.usefixtures("n_threads")

LARGE = large_2d()  # above every element-wise, reduction and softmax kernel's threshold
LARGE_TALL = large_2d(7)  # few long rows (sum's row split)
LARGE_BY_5 = (LARGE[0], LARGE[1] + 5 - LARGE[1] % 5)  # tiles a (1, 5) operand
LARGE_CE = (large_2d(10)[1] // 16 + 1, 10)  # softmax kernels count 16 per exp

def f32(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def away_from_zero(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml tiling: ``b`` repeated whole along every axis to ``shape``."""
    return np.tile(b, [s // t for s, t in zip(shape, b.shape)])


def untile(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum of the tiles of ``a`` of shape ``shape`` (repeat_back)."""
    split = []
    for s, t in zip(a.shape, shape):
        split += [s // t, t]
    return a.reshape(split).sum(axis=tuple(range(0, 2 * a.ndim, 2)))


def to_ggml_order(x: np.ndarray) -> np.ndarray:
    """Index a 4-D NumPy-order array as ``[i0, i1, i2, i3]``."""
    return x.transpose(3, 2, 1, 0)


# --- element-wise binary ops ------------------------------------------------------------

BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
# NumPy shapes (a, b); b tiles a.
BROADCASTS = [
    ((3, 5), (3, 5)),
    ((3, 5), (1, 5)),            # ggml b=[5,1] over a=[5,3]
    ((3, 5), (3, 1)),            # ggml b=[1,3] over a=[5,3]
    ((2, 3, 5), (1, 3, 5)),      # ggml b=[5,3,1] over a=[5,3,2]
    ((2, 3, 5), (1, 1, 1)),
    ((4, 9), (2, 3)),            # general tiling, not only size-1 broadcasting
    ((2, 3, 4, 5), (2, 1, 2, 5)),
    (LARGE, (1, LARGE[1])),      # above the parallel threshold
]


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binary_broadcast(rng, name, shapes):
    a, b = f32(rng, *shapes[0]), away_from_zero(rng, *shapes[1])
    out = run1(lambda c, x, y: getattr(ggopt, name)(c, x, y), a, b)
    assert out.shape == a.shape
    assert_close(out, BINARY[name](a, tile_to(b, a.shape)))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_non_contiguous(rng, name):
    # a is a transpose, b a permute of 3-D data broadcast over a's dim 2.
    a = f32(rng, 2, 5, 7)          # ggml [7,5,2]; transpose -> [5,7,2] = NumPy (2,7,5)
    b = away_from_zero(rng, 5, 1)  # ggml [1,5]; transpose -> [5,1]

    def build(c, x, y):
        return getattr(ggopt, name)(c, ggopt.transpose(c, x), ggopt.transpose(c, y))

    out = run1(build, a, b)
    ref = BINARY[name](a.swapaxes(1, 2), tile_to(b.T[None], (2, 7, 5)))
    assert_close(out, ref)


def test_add_inplace_is_view_of_a(rng):
    a, b = f32(rng, 3, 5), f32(rng, 1, 5)

    def build(c, x, y):
        r = ggopt.add_inplace(c, x, y)
        assert r.view_src is x
        return r

    assert_close(run1(build, a, b), a + b)


# --- scale and unary ops ----------------------------------------------------------------


def gelu_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


UNARY = {
    "sqr": (np.square, (-2, 2)),
    "sqrt": (np.sqrt, (0.1, 4)),
    "log": (np.log, (0.1, 4)),
    "neg": (np.negative, (-2, 2)),
    "exp": (np.exp, (-3, 3)),
    "abs": (np.abs, (-2, 2)),
    "relu": (lambda x: np.maximum(x, 0), (-2, 2)),
    "gelu": (gelu_ref, (-4, 4)),
    "silu": (lambda x: x / (1 + np.exp(-x.astype(np.float64))), (-6, 6)),
    "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), (-8, 8)),
    "step": (lambda x: (x > 0).astype(np.float32), (-2, 2)),
}

LAYOUTS = ["contiguous", "transposed", "view", "large"]


def _layout_input(rng, layout, lo, hi):
    """(input array, build of the op input from its tensor, NumPy of that op input)."""
    if layout == "contiguous":
        x = f32(rng, 3, 5, 7, lo=lo, hi=hi)
        return x, lambda c, t: t, x
    if layout == "transposed":
        x = f32(rng, 3, 5, 7, lo=lo, hi=hi)
        return x, lambda c, t: ggopt.transpose(c, t), x.swapaxes(1, 2)
    if layout == "view":  # rows 1..4 of a 5x9 matrix, columns 2..8
        x = f32(rng, 5, 9, lo=lo, hi=hi)
        return x, lambda c, t: ggopt.view_2d(c, t, 7, 4, t.nb[1], t.nb[1] + 2 * 4), x[1:, 2:]
    x = f32(rng, *LARGE, lo=lo, hi=hi)
    return x, lambda c, t: t, x


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name, layout):
    ref_fn, (lo, hi) = UNARY[name]
    x, view, xin = _layout_input(rng, layout, lo, hi)
    if name in ("relu", "step", "abs"):
        x.reshape(-1)[::7] = 0.0  # the kinks: relu(0) = step(0) = abs(0) = 0
    out = run1(lambda c, t: getattr(ggopt, name)(c, view(c, t)), x)
    assert_close(out, ref_fn(xin), rtol=2e-6, atol=1e-6)


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    relu, step, absx = run(lambda c, t: [ggopt.relu(c, t), ggopt.step(c, t), ggopt.abs(c, t)], x)
    np.testing.assert_array_equal(relu[:4], [0, 0, np.inf, 0])
    np.testing.assert_array_equal(step[:4], [0, 0, 1, 0])
    np.testing.assert_array_equal(absx[:4], [0, 0, np.inf, np.inf])
    assert np.isnan(absx[4])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scale(rng, layout):
    x, view, xin = _layout_input(rng, layout, -2, 2)
    assert_close(run1(lambda c, t: ggopt.scale(c, view(c, t), -0.37), x), np.float32(-0.37) * xin)


def test_scale_inplace(rng):
    x = f32(rng, 4, 3)
    assert_close(run1(lambda c, t: ggopt.scale_inplace(c, t, 2.5), x), 2.5 * x)


# --- reductions and tiling --------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sum_sum_rows_mean(rng, layout):
    x, view, xin = _layout_input(rng, layout, -2, 2)
    s, sr, mn = run(lambda c, t: [ggopt.sum(c, view(c, t)), ggopt.sum_rows(c, view(c, t)),
                                  ggopt.mean(c, view(c, t))], x)
    x64 = xin.astype(np.float64)
    assert_close(s, x64.sum(), rtol=1e-6)
    assert_close(sr, x64.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-5)
    assert_close(mn, x64.mean(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_sum_accumulates_accurately():
    # 0.1f summed over 300,000 times: a float32 running sum is off by ~1e-3 relative.
    x = np.full(LARGE_TALL, 0.1, np.float32)
    s = run1(ggopt.sum, x)
    assert_close(s, x.astype(np.float64).sum(), rtol=1e-6)


def test_sum_rows_4d_shape(rng):
    x = f32(rng, 2, 3, 4, 5)

    def build(c, t):
        r = ggopt.sum_rows(c, t)
        assert r.ne == (1, 4, 3, 2)
        return r

    assert_close(run1(build, x), x.sum(axis=-1, keepdims=True), atol=1e-5)


@pytest.mark.parametrize("shapes", [((1, 3, 1), (2, 3, 4)), ((2, 3), (4, 9)), ((3,), (2, 3, 6)),
                                    ((1, 5), LARGE_BY_5)], ids=str)
def test_repeat_and_repeat_back(rng, shapes):
    small, big = shapes
    a, b = f32(rng, *small), f32(rng, *big)
    small_full = (1,) * (len(big) - len(small)) + small

    def build(c, ta, tb):
        return [ggopt.repeat(c, ta, tb), ggopt.repeat_back(c, tb, ta)]

    rep, back = run(build, a, b)
    assert_close(rep, tile_to(a.reshape(small_full), big))
    assert_close(back, untile(b, small_full), rtol=1e-5, atol=1e-5)


def test_repeat_of_transposed(rng):
    a = f32(rng, 3, 2)  # transpose -> ggml [3,2], NumPy (2,3)
    b = f32(rng, 4, 6)
    out = run1(lambda c, ta, tb: ggopt.repeat(c, ggopt.transpose(c, ta), tb), a, b)
    assert_close(out, np.tile(a.T, (2, 2)))


def _strided(flat: np.ndarray, ne: tuple[int, ...], nb: tuple[int, ...], offset: int):
    """A NumPy view of ``flat`` (float32) with ggml shape ``ne``, byte strides ``nb``."""
    return np.lib.stride_tricks.as_strided(flat[offset // 4:], shape=ne[::-1], strides=nb[::-1])


@pytest.mark.parametrize("case", ["2d", "3d"])
def test_acc(rng, case):
    if case == "2d":
        a, b = f32(rng, 4, 6), f32(rng, 2, 3)
        nb = (4, 6 * 4, 6 * 4 * 2, 6 * 4 * 2)
        offset = (1 * 6 + 2) * 4
    else:
        a, b = f32(rng, 3, 4, 6), f32(rng, 2, 3, 2)
        nb = (4, 6 * 4, 6 * 4 * 4, 6 * 4 * 4 * 2)
        offset = (1 * 24 + 1 * 6 + 3) * 4

    out = run1(lambda c, ta, tb: ggopt.acc(c, ta, tb, nb[1], nb[2], nb[3], offset), a, b)
    ref = a.copy().reshape(-1)
    _strided(ref, b.shape[::-1], nb[:b.ndim], offset)[...] += b
    assert_close(out, ref.reshape(a.shape))


# --- softmax and losses -----------------------------------------------------------------


def softmax_ref(x: np.ndarray, s: float = 1.0) -> np.ndarray:
    z = s * x.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_soft_max(rng, layout):
    x, view, xin = _layout_input(rng, layout, -5, 5)
    assert_close(run1(lambda c, t: ggopt.soft_max(c, view(c, t)), x), softmax_ref(xin),
                 rtol=1e-5, atol=1e-7)


def test_soft_max_ext_and_large_logits(rng):
    x = f32(rng, 3, 11) + np.float32(500.0)  # exp would overflow without the max shift
    a, b = run(lambda c, t: [ggopt.soft_max(c, t),
                              ggopt.soft_max_ext(c, t, None, 0.5, 0.0)], x)
    assert_close(a, softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert_close(b, softmax_ref(x, 0.5), rtol=1e-5, atol=1e-7)


def ce_ref(x: np.ndarray, y: np.ndarray) -> float:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    y = y.reshape(-1, y.shape[-1]).astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    return float(-(y * lsm).sum() / x.shape[0])


@pytest.mark.parametrize("shape", [(7, 10), (2, 3, 5), (501, 10), LARGE_CE], ids=str)
def test_cross_entropy_loss_and_back(rng, shape):
    x = f32(rng, *shape, lo=-4, hi=4)
    y = softmax_ref(f32(rng, *shape, lo=-3, hi=3)).astype(np.float32)  # soft labels
    g = np.array([0.7], np.float32)

    def build(c, tx, ty, tg):
        return [ggopt.cross_entropy_loss(c, tx, ty), ggopt.cross_entropy_loss_back(c, tg, tx, ty)]

    loss, back = run(build, x, y, g)
    nr = x.size // x.shape[-1]
    assert_close(loss, ce_ref(x, y), rtol=1e-5)
    assert_close(back, (softmax_ref(x) - y) * 0.7 / nr, rtol=1e-4, atol=1e-7)


def test_cross_entropy_one_hot_transposed_logits(rng):
    x = f32(rng, 6, 10, lo=-4, hi=4)  # transpose -> ggml [6,10]: 10 rows of 6 classes
    y = np.eye(6, dtype=np.float32)[rng.integers(0, 6, 10)]
    out = run1(lambda c, tx, ty: ggopt.cross_entropy_loss(c, ggopt.transpose(c, tx), ty), x, y)
    assert_close(out, ce_ref(x.T, y), rtol=1e-5)


# --- matrix products --------------------------------------------------------------------


def mul_mat_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_mul_mat in NumPy 4-D terms: C[i3,i2] = B[i3,i2] @ A[i3 // r3, i2 // r2].T."""
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape).astype(np.float64)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape).astype(np.float64)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    aa = np.repeat(np.repeat(a4, r3, axis=0), r2, axis=1)
    return b4 @ aa.swapaxes(-1, -2)


# NumPy shapes (A, B): A (A3, A2, M, K), B (B3, B2, N, K)
MUL_MAT = [
    ((7, 5), (3, 5)),
    ((1, 5), (4, 5)),
    ((7, 5), (1, 5)),
    ((2, 6, 9), (2, 4, 9)),
    ((1, 2, 4, 5), (3, 4, 6, 5)),    # broadcast over dims 2 and 3
    ((2, 3, 4, 5), (4, 6, 3, 5)),    # a's i2 = b's i2 // 2, i3 = i3 // 2
    ((33, 65), (47, 65)),
]


@pytest.mark.parametrize("shapes", MUL_MAT, ids=str)
def test_mul_mat(rng, shapes):
    a, b = f32(rng, *shapes[0]), f32(rng, *shapes[1])

    def build(c, ta, tb):
        r = ggopt.mul_mat(c, ta, tb)
        assert r.ne == (ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3])
        return r

    assert_close(run1(build, a, b), mul_mat_ref(a, b), rtol=1e-5, atol=1e-5)


def test_mul_mat_non_contiguous(rng):
    # a: every other row of a 12x5 matrix (a strided view), b: a transpose.
    a, b = f32(rng, 12, 5), f32(rng, 5, 4)

    def build(c, ta, tb):
        av = ggopt.view_2d(c, ta, 5, 6, 2 * ta.nb[1], ta.nb[1])
        return ggopt.mul_mat(c, av, ggopt.transpose(c, tb))

    assert_close(run1(build, a, b), mul_mat_ref(a[1::2], b.T), rtol=1e-5, atol=1e-5)


def out_prod_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_out_prod: R[i3,i2] = B[i3,i2].T @ A[i3 // r3, i2 // r2]."""
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape).astype(np.float64)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape).astype(np.float64)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    aa = np.repeat(np.repeat(a4, r3, axis=0), r2, axis=1)
    return b4.swapaxes(-1, -2) @ aa


@pytest.mark.parametrize("shapes", [((5, 7), (5, 3)), ((5, 1), (5, 4)), ((2, 6, 3), (4, 6, 5)),
                                    ((40, 33), (40, 47))], ids=str)
def test_out_prod(rng, shapes):
    a, b = f32(rng, *shapes[0]), f32(rng, *shapes[1])

    def build(c, ta, tb):
        r = ggopt.out_prod(c, ta, tb)
        assert r.ne == (ta.ne[0], tb.ne[0], tb.ne[2], tb.ne[3])
        return r

    assert_close(run1(build, a, b), out_prod_ref(a, b), rtol=1e-5, atol=1e-5)


def test_out_prod_transposed_b(rng):
    a, b = f32(rng, 5, 7), f32(rng, 3, 5)  # b transposed -> ggml [3,5], NumPy (5,3)
    out = run1(lambda c, ta, tb: ggopt.out_prod(c, ta, ggopt.transpose(c, tb)), a, b)
    assert_close(out, out_prod_ref(a, b.T), rtol=1e-5, atol=1e-5)


# --- integer ops ------------------------------------------------------------------------


def test_argmax_last_max_on_ties(rng):
    x = rng.integers(0, 3, (9, 5)).astype(np.float32)  # many ties
    x[0] = [-1, -1, -1, -1, -1]
    out = run1(ggopt.argmax, x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1))


def test_argmax_large_and_transposed(rng):
    x = f32(rng, 300, 129)
    out = run1(ggopt.argmax, x)
    np.testing.assert_array_equal(out, np.argmax(x, axis=1))
    out = run1(lambda c, t: ggopt.argmax(c, ggopt.transpose(c, t)), x)
    np.testing.assert_array_equal(out, np.argmax(x.T, axis=1))


def test_count_equal(rng):
    a = rng.integers(0, 4, (3, 11)).astype(np.int32)
    b = rng.integers(0, 4, (3, 11)).astype(np.int32)
    out = run1(ggopt.count_equal, a, b)
    assert out.dtype == np.int64
    assert int(out.reshape(())) == int((a == b).sum())


def test_argmax_count_equal_chain(rng):
    logits, labels = f32(rng, 37, 10), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 37)]
    out = run1(lambda c, x, y: ggopt.count_equal(c, ggopt.argmax(c, x), ggopt.argmax(c, y)),
               logits, labels)
    assert int(out.reshape(())) == int((logits.argmax(1) == labels.argmax(1)).sum())


# --- rows -------------------------------------------------------------------------------


def test_get_rows_2d(rng):
    a = f32(rng, 6, 5)
    idx = np.array([3, 0, 5, 3], np.int32)
    out = run1(ggopt.get_rows, a, idx)
    assert_close(out, a[idx])


def test_get_rows_4d(rng):
    a = f32(rng, 2, 3, 6, 5)
    idx = rng.integers(0, 6, (2, 3, 4)).astype(np.int32)
    out = run1(ggopt.get_rows, a, idx)
    ref = np.take_along_axis(a, idx[..., None].astype(np.int64), axis=2)
    assert out.shape == (2, 3, 4, 5)
    assert_close(out, ref)


def test_get_rows_back(rng):
    g = f32(rng, 7, 5)
    idx = np.array([1, 4, 1, 0, 4, 4, 2], np.int32)
    like = np.zeros((6, 5), np.float32)
    out = run1(ggopt.get_rows_back, g, idx, like)
    ref = np.zeros_like(like)
    np.add.at(ref, idx, g)
    assert out.shape == (6, 5)
    assert_close(out, ref, atol=1e-6)


# --- convolution and pooling ------------------------------------------------------------

# (KH, KW, s0, s1, p0, p1, d0, d1); index 0 acts on the width, 1 on the height
CONV = [
    (3, 3, 1, 1, 1, 1, 1, 1),
    (3, 3, 1, 1, 0, 0, 1, 1),
    (2, 3, 2, 1, 0, 1, 1, 1),
    (3, 2, 1, 2, 2, 0, 2, 1),
    (1, 1, 1, 1, 0, 0, 1, 1),
]


def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col_ref(x: np.ndarray, KH, KW, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    N, IC, IH, IW = x.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    out = np.zeros((N, OH, OW, IC, KH, KW), np.float32)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                    if 0 <= iy < IH and 0 <= ix < IW:
                        out[:, oh, ow, :, kh, kw] = x[:, :, iy, ix]
    return out.reshape(N, OH, OW, IC * KH * KW)


def im2col_back_ref(g: np.ndarray, x_shape, KH, KW, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    N, IC, IH, IW = x_shape
    OH, OW = g.shape[1], g.shape[2]
    g6 = g.reshape(N, OH, OW, IC, KH, KW).astype(np.float64)
    out = np.zeros(x_shape)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                    if 0 <= iy < IH and 0 <= ix < IW:
                        out[:, :, iy, ix] += g6[:, oh, ow, :, kh, kw]
    return out


@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_im2col_and_back(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 4, 3, KH, KW)

    def build(c, tx, tk):
        return ggopt.im2col(c, tk, tx, s0, s1, p0, p1, d0, d1, True, ggopt.F32)

    cols = run1(build, x, k)
    ref = im2col_ref(x, KH, KW, s0, s1, p0, p1, d0, d1)
    assert cols.shape == ref.shape
    assert_close(cols, ref)

    g = f32(rng, *ref.shape)

    def build_back(c, tg, tk):
        return ggopt.im2col_back(c, tg, tk, (6, 7, 3, 2), s0, s1, p0, p1, d0, d1)

    back = run1(build_back, g, k)
    assert_close(back, im2col_back_ref(g, x.shape, KH, KW, s0, s1, p0, p1, d0, d1),
                 rtol=1e-5, atol=1e-5)
    # adjoint identity <im2col(x), g> == <x, im2col_back(g)>
    np.testing.assert_allclose((cols.astype(np.float64) * g).sum(),
                               (x.astype(np.float64) * back).sum(), rtol=1e-5)


def conv2d_ref(x: np.ndarray, k: np.ndarray, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    """Direct cross-correlation, NCHW input, (OC, IC, KH, KW) kernel."""
    N, IC, IH, IW = x.shape
    OC, _, KH, KW = k.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    xp[:, :, p1:p1 + IH, p0:p0 + IW] = x
    out = np.zeros((N, OC, OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            patch = xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
                       kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0]
            out += np.einsum("nchw,oc->nohw", patch, k[:, :, kh, kw])
    return out


@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_conv_2d(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 5, 3, KH, KW)

    def build(c, tx, tk):
        return ggopt.conv_2d(c, tk, tx, s0, s1, p0, p1, d0, d1)

    out = run1(build, x, k)
    ref = conv2d_ref(x, k, s0, s1, p0, p1, d0, d1)
    assert out.shape == ref.shape
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


def conv2d_back_input_ref(k: np.ndarray, g: np.ndarray, x_shape, s0, s1, p0, p1, d0,
                          d1) -> np.ndarray:
    """The adjoint of :func:`conv2d_ref` in its input."""
    N, IC, IH, IW = x_shape
    _, _, KH, KW = k.shape
    OH, OW = g.shape[2], g.shape[3]
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    for kh in range(KH):
        for kw in range(KW):
            xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
               kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0] += np.einsum(
                "nohw,oc->nchw", g, k[:, :, kh, kw])
    return xp[:, :, p1:p1 + IH, p0:p0 + IW]


def conv2d_back_kernel_ref(x: np.ndarray, g: np.ndarray, k_shape, s0, s1, p0, p1, d0,
                           d1) -> np.ndarray:
    """The gradient of ``sum(conv2d_ref(x, k) * g)`` in ``k``."""
    N, IC, IH, IW = x.shape
    _, _, KH, KW = k_shape
    OH, OW = g.shape[2], g.shape[3]
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    xp[:, :, p1:p1 + IH, p0:p0 + IW] = x
    out = np.zeros(k_shape)
    for kh in range(KH):
        for kw in range(KW):
            patch = xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
                       kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0]
            out[:, :, kh, kw] = np.einsum("nchw,nohw->oc", patch, g)
    return out


@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_conv_2d_direct_and_its_gradient_ops(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    prm = (s0, s1, p0, p1, d0, d1)
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 5, 3, KH, KW)
    out = run1(lambda c, tx, tk: ggopt.conv_2d_direct(c, tk, tx, *prm), x, k)
    assert_close(out, conv2d_ref(x, k, *prm), rtol=1e-5, atol=1e-5)
    g = f32(rng, *out.shape)
    dx = run1(lambda c, tk, tg: ggopt.conv_2d_back_input(c, tk, tg, (6, 7, 3, 2), *prm), k, g)
    assert_close(dx, conv2d_back_input_ref(k, g, x.shape, *prm), rtol=1e-5, atol=1e-5)
    dk = run1(lambda c, tx, tg: ggopt.conv_2d_back_kernel(c, tx, tg, (KW, KH, 3, 5), *prm), x, g)
    assert_close(dk, conv2d_back_kernel_ref(x, g, k.shape, *prm), rtol=1e-5, atol=1e-4)


def test_conv_2d_is_one_direct_node():
    ctx = ggopt.Context()
    x = ctx.new_tensor_4d(ggopt.F32, 6, 7, 3, 2)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 3, 5)
    y = ggopt.conv_2d(ctx, k, x, 1, 1, 1, 1, 1, 1)
    assert y.op is ggopt.tensor.Op.CONV_2D and y.src[:2] == (k, x) and y.ne == (6, 7, 5, 2)
    assert y.op_params == ggopt.ops.Conv2DParams(1, 1, 1, 1, 1, 1)


def test_conv_2d_permuted_input(rng):
    # the input arrives NHWC and is permuted to ggml [W, H, C, N] without a copy
    x_nhwc, k = f32(rng, 2, 6, 5, 3), f32(rng, 4, 3, 3, 3)

    def build(c, tx, tk):
        return ggopt.conv_2d(c, tk, ggopt.permute(c, tx, 2, 0, 1, 3), 1, 1, 1, 1, 1, 1)

    ref = conv2d_ref(x_nhwc.transpose(0, 3, 1, 2), k, 1, 1, 1, 1, 1, 1)
    assert_close(run1(build, x_nhwc, k), ref, rtol=1e-5, atol=1e-5)


# (k0, k1, s0, s1, p0, p1); index 0 acts on the width
POOL = [
    (2, 2, 2, 2, 0, 0),
    (3, 3, 2, 2, 0, 0),
    (3, 3, 2, 2, 1, 1),
    (2, 3, 1, 2, 1, 0),
    (3, 2, 3, 1, 0, 1),
]


def _pool_out(size, k, s, p):
    return int(np.float32(size + 2 * p - k) / np.float32(s)) + 1


def _windows(x_shape, k0, k1, s0, s1, p0, p1):
    """Yield (oh, ow, [(iy, ix) in-bounds cells in scan order])."""
    IH, IW = x_shape[2], x_shape[3]
    for oh in range(_pool_out(IH, k1, s1, p1)):
        for ow in range(_pool_out(IW, k0, s0, p0)):
            cells = [(oh * s1 - p1 + ky, ow * s0 - p0 + kx) for ky in range(k1) for kx in range(k0)]
            yield oh, ow, [(y, x) for y, x in cells if 0 <= y < IH and 0 <= x < IW]


def pool_ref(x: np.ndarray, op: int, k0, k1, s0, s1, p0, p1) -> np.ndarray:
    N, C, IH, IW = x.shape
    out = np.zeros((N, C, _pool_out(IH, k1, s1, p1), _pool_out(IW, k0, s0, p0)), np.float64)
    for oh, ow, cells in _windows(x.shape, k0, k1, s0, s1, p0, p1):
        vals = np.stack([x[:, :, y, xx] for y, xx in cells], -1).astype(np.float64)
        if op == ggopt.OP_POOL_MAX:
            out[:, :, oh, ow] = vals.max(-1)
        else:
            out[:, :, oh, ow] = vals.sum(-1) / (k0 * k1)  # padding counts as 0
    return out


def pool_back_ref(g, x, op, k0, k1, s0, s1, p0, p1) -> np.ndarray:
    out = np.zeros(x.shape, np.float64)
    N, C = x.shape[:2]
    for oh, ow, cells in _windows(x.shape, k0, k1, s0, s1, p0, p1):
        for n in range(N):
            for c in range(C):
                if op == ggopt.OP_POOL_MAX:
                    vals = [x[n, c, y, xx] for y, xx in cells]
                    y, xx = cells[int(np.argmax(vals))]  # the first maximum in scan order
                    out[n, c, y, xx] += g[n, c, oh, ow]
                else:
                    for y, xx in cells:
                        out[n, c, y, xx] += g[n, c, oh, ow] / (k0 * k1)
    return out


@pytest.mark.parametrize("op", [ggopt.OP_POOL_MAX, ggopt.OP_POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("cfg", POOL, ids=str)
def test_pool_2d_and_back(rng, op, cfg):
    x = f32(rng, 2, 3, 7, 6)
    if op == ggopt.OP_POOL_MAX:
        x[0, 0, :2, :2] = 3.0  # ties: the gradient goes to the first maximum only
    k0, k1, s0, s1, p0, p1 = cfg
    out = run1(lambda c, t: ggopt.pool_2d(c, t, op, *cfg), x)
    ref = pool_ref(x, op, *cfg)
    assert out.shape == ref.shape
    assert_close(out, ref, rtol=1e-6, atol=1e-6)

    g = f32(rng, *ref.shape)
    back = run1(lambda c, tg, tx: ggopt.pool_2d_back(c, tg, tx, op, *cfg), g, x)
    assert_close(back, pool_back_ref(g, x, op, *cfg), rtol=1e-5, atol=1e-6)


def test_pool_2d_transposed_input(rng):
    x = f32(rng, 1, 2, 6, 8)  # transpose -> ggml [6,8,2,1]: NumPy (1,2,8,6)
    out = run1(lambda c, t: ggopt.pool_2d(c, ggopt.transpose(c, t), ggopt.OP_POOL_MAX,
                                          2, 2, 2, 2, 0, 0), x)
    assert_close(out, pool_ref(x.swapaxes(2, 3), ggopt.OP_POOL_MAX, 2, 2, 2, 2, 0, 0))


# --- views, reshapes, permutes and copies -----------------------------------------------


def test_views(rng):
    x = f32(rng, 3, 4, 5)  # ggml [5,4,3]
    nb1, nb2 = 5 * 4, 20 * 4

    def build(c, t):
        return [
            ggopt.cont(c, ggopt.view_1d(c, t, 7, 3 * 4)),
            ggopt.cont(c, ggopt.view_2d(c, t, 3, 4, nb1, 2 * 4)),
            ggopt.cont(c, ggopt.view_3d(c, t, 2, 3, 2, nb1, nb2, nb2 + nb1 + 4)),
            ggopt.sqr(c, ggopt.view_4d(c, t, 4, 2, 1, 3, 2 * nb1, nb2, nb2, 4)),
        ]

    v1, v2, v3, v4 = run(build, x)
    assert_close(v1, x.reshape(-1)[3:10])
    assert_close(v2, x[0, :, 2:5])
    assert_close(v3, x[1:3, 1:4, 1:3])
    assert_close(v4, np.square(x[:, 0:4:2, 1:5]).reshape(3, 1, 2, 4))


def test_reshapes(rng):
    x = f32(rng, 2, 3, 4, 5)
    like = np.zeros((6, 20), np.float32)

    def build(c, t, tl):
        return [
            ggopt.cont(c, ggopt.reshape_1d(c, t, 120)),
            ggopt.cont(c, ggopt.reshape_2d(c, t, 10, 12)),
            ggopt.sqr(c, ggopt.reshape_3d(c, t, 6, 5, 4)),
            ggopt.cont(c, ggopt.reshape_4d(c, t, 3, 4, 5, 2)),
            ggopt.cont(c, ggopt.reshape(c, t, tl)),
        ]

    r1, r2, r3, r4, r5 = run(build, x, like)
    assert r2.shape == (12, 10) and r3.shape == (4, 5, 6) and r4.shape == (2, 5, 4, 3)
    assert_close(r1, x.reshape(120))
    assert_close(r2, x.reshape(12, 10))
    assert_close(r3, np.square(x).reshape(4, 5, 6))
    assert_close(r4, x.reshape(2, 5, 4, 3))
    assert_close(r5, x.reshape(6, 20))


def permute_ref(x: np.ndarray, axes) -> np.ndarray:
    """ggml_permute on a 4-D NumPy-order array: source dim i moves to position axes[i]."""
    inv = [0] * 4
    for i, ax in enumerate(axes):
        inv[ax] = i
    return to_ggml_order(np.transpose(to_ggml_order(x), inv))


@pytest.mark.parametrize("axes", [(1, 2, 0, 3), (2, 0, 3, 1), (0, 1, 3, 2), (3, 2, 1, 0),
                                  (1, 0, 2, 3)], ids=str)
def test_permute(rng, axes):
    x = f32(rng, 2, 3, 4, 5)

    def build(c, t):
        p = ggopt.permute(c, t, *axes)
        return [ggopt.cont(c, p), ggopt.scale(c, p, 2.0)]

    cont, scaled = run(build, x)
    ref = permute_ref(x, axes)
    assert cont.shape == ref.shape
    assert_close(cont, ref)
    assert_close(scaled, 2 * ref)


def test_transpose_cont_dup(rng):
    x = f32(rng, 3, 4, 5)

    def build(c, t):
        tr = ggopt.transpose(c, t)
        return [ggopt.cont(c, tr), ggopt.dup(c, tr), ggopt.dup(c, t)]

    cont, dup_t, dup = run(build, x)
    assert_close(cont, x.swapaxes(1, 2))
    assert_close(dup_t, x.swapaxes(1, 2))
    assert_close(dup, x)


def test_cpy_type_conversions(rng):
    x32 = f32(rng, 3, 5) * np.float32(100.0)
    x16 = f32(rng, 3, 5).astype(np.float16)
    dst16 = np.zeros((3, 5), np.float16)
    dst32 = np.zeros((5, 3), np.float32)

    def build(c, a32, a16, d16, d32):
        r16 = ggopt.cpy(c, a32, d16)
        r32 = ggopt.cpy(c, ggopt.transpose(c, a16), d32)
        assert r16.type is ggopt.F16 and r16.view_src is d16
        return [r16, r32]

    r16, r32 = run(build, x32, x16, dst16, dst32)
    assert r16.dtype == np.float16 and r32.dtype == np.float32
    np.testing.assert_array_equal(r16, x32.astype(np.float16))
    np.testing.assert_array_equal(r32, x16.T.astype(np.float32))


def test_cpy_reshapes_in_ggml_order(rng):
    x = f32(rng, 3, 4)  # transpose -> ggml [3,4]: NumPy (4,3); copied into a flat [12]
    out = run1(lambda c, t, d: ggopt.cpy(c, ggopt.transpose(c, t), d), x, np.zeros(12, np.float32))
    assert_close(out, x.T.reshape(-1))


# --- optimizer steps (ggml-opt-spec §2.10) -------------------------------------------------------


def _opt_step(build, w, *others):
    """Run one optimizer-step graph; the updated ``[w, *others]`` (updated in place)."""

    def wrapped(c, tw, *ts):
        ggopt.set_param(tw)
        return [build(c, tw, *ts), tw, *ts]

    return run(wrapped, w, *others)[1:]


def test_opt_step_adamw(rng):
    w, g = f32(rng, 3, 7), f32(rng, 3, 7)
    m, v = f32(rng, 3, 7, lo=-0.1, hi=0.1), f32(rng, 3, 7, lo=0.0, hi=0.2)
    alpha, b1, b2, eps, wd, t = 1e-2, 0.9, 0.999, 1e-8, 0.1, 3
    prm = np.array([alpha, b1, b2, eps, wd, 1 / (1 - b1 ** t), 1 / (1 - b2 ** t)], np.float32)

    w1, g1, m1, v1, _ = _opt_step(ggopt.opt_step_adamw, w, g, m, v, prm)
    p = prm.astype(np.float64)
    m_ref = m * p[1] + g * (1 - p[1])
    v_ref = v * p[2] + g.astype(np.float64) ** 2 * (1 - p[2])
    w_ref = w * (1 - p[0] * p[4]) - p[0] * (m_ref * p[5]) / (np.sqrt(v_ref * p[6]) + p[3])
    assert_close(m1, m_ref, rtol=1e-5, atol=1e-7)
    assert_close(v1, v_ref, rtol=1e-5, atol=1e-8)
    assert_close(w1, w_ref, rtol=1e-5, atol=1e-6)
    assert_close(g1, g)  # the gradient is read only


def test_opt_step_sgd(rng):
    w, g = f32(rng, 301, 129), f32(rng, 301, 129)
    prm = np.array([0.05, 0.2], np.float32)
    w1, g1, _ = _opt_step(ggopt.opt_step_sgd, w, g, prm)
    assert_close(w1, w * (1 - 0.05 * 0.2) - 0.05 * g.astype(np.float64), rtol=1e-6, atol=1e-6)
