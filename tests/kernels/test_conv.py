"""im2col, im2col_back, pool_2d and pool_2d_back kernels against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _conv
from ggopt._kernels import _pool as PK

FLT_MAX = np.finfo(np.float32).max
THREADS = [1, 2]
LAYOUTS = ["contiguous", "strided", "transposed", "reversed", "readonly"]

# (KH, KW, s0, s1, p0, p1, d0, d1): index 0 acts on the width, 1 on the height.
CONV_CONFIGS = [
    (3, 3, 1, 1, 1, 1, 1, 1),
    (3, 3, 1, 1, 0, 0, 1, 1),
    (1, 1, 1, 1, 0, 0, 1, 1),
    (2, 3, 2, 1, 0, 1, 1, 1),
    (3, 2, 1, 2, 2, 0, 2, 1),
    (5, 4, 3, 2, 2, 1, 1, 2),
    (3, 3, 2, 2, 3, 3, 1, 1),
    (4, 1, 1, 3, 0, 2, 1, 1),
]
# (k0, k1, s0, s1, p0, p1)
POOL_CONFIGS = [
    (2, 2, 2, 2, 0, 0),
    (3, 3, 2, 2, 0, 0),
    (3, 3, 2, 2, 1, 1),
    (2, 3, 1, 2, 1, 0),
    (3, 2, 3, 1, 0, 1),
    (1, 1, 1, 1, 0, 0),
]


def _layout(a: np.ndarray, kind: str) -> np.ndarray:
    """Return an array equal to ``a`` with the memory layout named by ``kind``."""
    if kind == "contiguous":
        return np.ascontiguousarray(a)
    if kind == "strided":
        base = np.full(a.shape[:-1] + (2 * a.shape[-1] + 1,), np.nan, a.dtype)
        base[..., 1::2] = a
        return base[..., 1::2]
    if kind == "transposed":
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if kind == "reversed":
        return np.ascontiguousarray(a[:, ::-1, ::-1])[:, ::-1, ::-1]
    if kind == "readonly":
        b = a.copy()
        b.setflags(write=False)
        return b
    raise ValueError(kind)


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _pool_out(size: int, k: int, s: int, p: int) -> int:
    return int(np.float32(size + 2 * p - k) / np.float32(s)) + 1


def _window_slices(kh, kw, oh, ow, s0, s1, d0, d1):
    """Slices of the padded image read by kernel tap (kh, kw) for every output position."""
    return (
        slice(kh * d1, kh * d1 + (oh - 1) * s1 + 1, s1),
        slice(kw * d0, kw * d0 + (ow - 1) * s0 + 1, s0),
    )


def im2col_ref(x, KH, KW, s0, s1, p0, p1, d0, d1):
    N, IC, IH, IW = x.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    xp = np.pad(x, ((0, 0), (0, 0), (p1, p1), (p0, p0)))
    out = np.empty((N, OH, OW, IC, KH, KW), x.dtype)
    for kh in range(KH):
        for kw in range(KW):
            sh, sw = _window_slices(kh, kw, OH, OW, s0, s1, d0, d1)
            out[..., kh, kw] = xp[:, :, sh, sw].transpose(0, 2, 3, 1)
    return out.reshape(N, OH, OW, IC * KH * KW)


def im2col_back_ref(g, shape, KH, KW, s0, s1, p0, p1, d0, d1):
    N, IC, IH, IW = shape
    _, OH, OW, _ = g.shape
    gr = g.astype(np.float64).reshape(N, OH, OW, IC, KH, KW)
    dp = np.zeros((N, IC, IH + 2 * p1, IW + 2 * p0))
    for kh in range(KH):
        for kw in range(KW):
            sh, sw = _window_slices(kh, kw, OH, OW, s0, s1, d0, d1)
            dp[:, :, sh, sw] += gr[..., kh, kw].transpose(0, 3, 1, 2)
    return dp[:, :, p1 : p1 + IH, p0 : p0 + IW]


def _windows(IH, IW, OH, OW, k0, k1, s0, s1, p0, p1):
    """Yield (oy, ox, row slice, column slice) of every in-bounds pooling window."""
    for oy in range(OH):
        y0 = oy * s1 - p1
        for ox in range(OW):
            x0 = ox * s0 - p0
            ys = slice(max(y0, 0), min(y0 + k1, IH))
            xs = slice(max(x0, 0), min(x0 + k0, IW))
            yield oy, ox, ys, xs


def pool_ref(x, op, k0, k1, s0, s1, p0, p1):
    N, C, IH, IW = x.shape
    OH, OW = _pool_out(IH, k1, s1, p1), _pool_out(IW, k0, s0, p0)
    out = np.empty((N, C, OH, OW), np.float32)
    for oy, ox, ys, xs in _windows(IH, IW, OH, OW, k0, k1, s0, s1, p0, p1):
        win = x[:, :, ys, xs].reshape(N, C, -1)
        if op == PK.POOL_MAX:
            best = win.max(axis=-1) if win.shape[-1] else np.full((N, C), -np.inf)
            out[:, :, oy, ox] = np.maximum(best, -FLT_MAX)
        else:
            out[:, :, oy, ox] = win.sum(axis=-1, dtype=np.float64) / (k0 * k1)
    return out


def pool_back_ref(g, x, op, k0, k1, s0, s1, p0, p1):
    N, C, IH, IW = x.shape
    _, _, OH, OW = g.shape
    dst = np.zeros(x.shape, np.float64)
    nn, cc = np.meshgrid(np.arange(N), np.arange(C), indexing="ij")
    for oy, ox, ys, xs in _windows(IH, IW, OH, OW, k0, k1, s0, s1, p0, p1):
        win = x[:, :, ys, xs].reshape(N, C, -1)
        if win.shape[-1] == 0:
            continue
        if op == PK.POOL_MAX:
            first = win.argmax(axis=-1)  # NumPy's argmax returns the first maximum
            width = xs.stop - xs.start
            gv = np.where(win.max(axis=-1) > -FLT_MAX, g[:, :, oy, ox], 0.0)
            np.add.at(dst, (nn, cc, ys.start + first // width, xs.start + first % width), gv)
        else:
            dst[:, :, ys, xs] += g[:, :, oy, ox, None, None] / (k0 * k1)
    return dst


def _im2col(x, cfg, n_threads):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    N, IC, IH, IW = x.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    dst = np.full((N, OH, OW, IC * KH * KW), np.nan, np.float32)
    _conv.im2col(x, dst, KH, KW, s0, s1, p0, p1, d0, d1, n_threads)
    return dst


def _im2col_back(g, shape, cfg, n_threads):
    dst = np.full(shape, np.nan, np.float32)
    _conv.im2col_back(g, dst, *cfg, n_threads)
    return dst


def _pool(x, op, cfg, n_threads):
    k0, k1, s0, s1, p0, p1 = cfg
    N, C, IH, IW = x.shape
    dst = np.full((N, C, _pool_out(IH, k1, s1, p1), _pool_out(IW, k0, s0, p0)), np.nan, np.float32)
    PK.pool_2d(x, dst, op, *cfg, n_threads)
    return dst


def _pool_back(g, x, op, cfg, n_threads):
    dst = np.full(x.shape, np.nan, np.float32)
    PK.pool_2d_back(g, x, dst, op, *cfg, n_threads)
    return dst


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("cfg", CONV_CONFIGS)
@pytest.mark.parametrize("shape", [(2, 3, 9, 11), (5, 4, 17, 13)])
def test_im2col_matches_reference(shape, cfg, n_threads):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(_im2col(x, cfg, n_threads), im2col_ref(x, *cfg))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n_threads", THREADS)
def test_im2col_any_strides(layout, n_threads):
    cfg = (3, 3, 2, 1, 1, 2, 1, 2)
    x = np.random.default_rng(1).standard_normal((4, 3, 15, 12)).astype(np.float32)
    expected = im2col_ref(x, *cfg)
    np.testing.assert_array_equal(_im2col(_layout(x, layout), cfg, n_threads), expected)


def test_im2col_mnist_shapes():
    cfg = (3, 3, 1, 1, 1, 1, 1, 1)
    x = np.random.default_rng(2).standard_normal((20, 8, 14, 14)).astype(np.float32)
    got = _im2col(x, cfg, 2)
    assert got.shape == (20, 14, 14, 72)
    np.testing.assert_array_equal(got, im2col_ref(x, *cfg))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("cfg", CONV_CONFIGS)
@pytest.mark.parametrize("shape", [(2, 3, 9, 11), (5, 4, 17, 13)])
def test_im2col_back_matches_reference(shape, cfg, n_threads):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    N, IC, IH, IW = shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    g = np.random.default_rng(3).standard_normal((N, OH, OW, IC * KH * KW)).astype(np.float32)
    got = _im2col_back(g, shape, cfg, n_threads)
    np.testing.assert_allclose(got, im2col_back_ref(g, shape, *cfg), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n_threads", THREADS)
def test_im2col_back_any_strides(layout, n_threads):
    cfg = (3, 2, 1, 2, 2, 1, 2, 1)
    shape = (3, 2, 13, 10)
    OH, OW = _conv_out(13, 3, 2, 1, 1), _conv_out(10, 2, 1, 2, 2)
    g = np.random.default_rng(4).standard_normal((3, OH, OW, 12)).astype(np.float32)
    got = _im2col_back(_layout(g, layout), shape, cfg, n_threads)
    np.testing.assert_allclose(got, im2col_back_ref(g, shape, *cfg), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", CONV_CONFIGS)
def test_im2col_back_is_adjoint_of_im2col(cfg):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 12, 9)).astype(np.float32)
    cols = _im2col(x, cfg, 2)
    g = rng.standard_normal(cols.shape).astype(np.float32)
    lhs = np.vdot(cols.astype(np.float64), g.astype(np.float64))
    rhs = np.vdot(x.astype(np.float64), _im2col_back(g, x.shape, cfg, 2).astype(np.float64))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5)


def test_im2col_back_thread_count_does_not_change_result():
    cfg = (3, 3, 1, 1, 1, 1, 1, 1)
    g = np.random.default_rng(6).standard_normal((9, 14, 14, 72)).astype(np.float32)
    one = _im2col_back(g, (9, 8, 14, 14), cfg, 1)
    np.testing.assert_array_equal(_im2col_back(g, (9, 8, 14, 14), cfg, 2), one)


@pytest.mark.parametrize("op", [PK.POOL_MAX, PK.POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("cfg", POOL_CONFIGS)
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (8, 6, 24, 31)])
def test_pool_2d_matches_reference(shape, cfg, n_threads, op):
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    got = _pool(x, op, cfg, n_threads)
    expected = pool_ref(x, op, *cfg)
    if op == PK.POOL_MAX:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [PK.POOL_MAX, PK.POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cfg", [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 1, 1)])
def test_pool_2d_any_strides(cfg, layout, op):
    x = np.random.default_rng(8).standard_normal((3, 4, 11, 10)).astype(np.float32)
    got = _pool(_layout(x, layout), op, cfg, 2)
    np.testing.assert_allclose(got, pool_ref(x, op, *cfg), rtol=1e-6, atol=1e-7)


def _nan_inf_plane() -> np.ndarray:
    """A 4x4 plane of -inf with two NaNs and one finite value, -3 at (0, 1)."""
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    x[0, 0, 0, 0] = np.nan
    x[0, 0, 0, 1] = -3.0
    x[0, 0, 3, 3] = np.nan
    return x


M = -FLT_MAX


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [((2, 2, 2, 2, 0, 0), [[-3, M], [M, M]]), ((3, 3, 2, 2, 1, 1), [[-3, -3], [M, M]])],
)
def test_pool_2d_max_skips_nan_and_padding(cfg, expected):
    # NaN never beats the running maximum; windows of only -inf/NaN give -FLT_MAX.
    got = _pool(_nan_inf_plane(), PK.POOL_MAX, cfg, 1)
    np.testing.assert_array_equal(got[0, 0], np.array(expected, np.float32))


def test_pool_2d_avg_counts_padding_as_zero():
    x = np.ones((1, 1, 3, 3), np.float32)
    got = _pool(x, PK.POOL_AVG, (3, 3, 2, 2, 1, 1), 1)
    np.testing.assert_allclose(got[0, 0], [[4 / 9, 4 / 9], [4 / 9, 4 / 9]], rtol=1e-6)


@pytest.mark.parametrize("op", [PK.POOL_MAX, PK.POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("cfg", POOL_CONFIGS)
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (8, 6, 24, 31)])
def test_pool_2d_back_matches_reference(shape, cfg, n_threads, op):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(_pool(x, op, cfg, 1).shape).astype(np.float32)
    got = _pool_back(g, x, op, cfg, n_threads)
    np.testing.assert_allclose(got, pool_back_ref(g, x, op, *cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cfg", [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 1, 1)])
def test_pool_2d_back_any_strides(cfg, layout):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 4, 11, 10)).astype(np.float32)
    g = rng.standard_normal(_pool(x, PK.POOL_MAX, cfg, 1).shape).astype(np.float32)
    got = _pool_back(_layout(g, layout), _layout(x, layout), PK.POOL_MAX, cfg, 2)
    np.testing.assert_allclose(got, pool_back_ref(g, x, PK.POOL_MAX, *cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("cfg", [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1)])
def test_pool_2d_back_max_ties_go_to_first_maximum(cfg, layout):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, (4, 3, 9, 9)).astype(np.float32)
    g = rng.standard_normal(_pool(x, PK.POOL_MAX, cfg, 1).shape).astype(np.float32)
    got = _pool_back(g, _layout(x, layout), PK.POOL_MAX, cfg, 2)
    np.testing.assert_allclose(got, pool_back_ref(g, x, PK.POOL_MAX, *cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_threads", THREADS)
def test_pool_2d_back_max_2x2_row_kernel_equals_the_general_loop(n_threads):
    """The vectorized 2x2 stride-2 MAX rows against the general window loop (taken for x with
    strided rows): ties, NaN, infinities and -FLT_MAX, odd sizes, same bits."""
    rng = np.random.default_rng(12)
    x = rng.integers(0, 3, (3, 2, 11, 37)).astype(np.float32)
    specials = np.array([np.nan, -np.inf, np.inf, -FLT_MAX], np.float32)
    x.reshape(-1)[rng.choice(x.size, 300, replace=False)] = rng.choice(specials, 300)
    x[0, 0, :4, :4] = -np.inf  # windows that nothing wins
    g = rng.standard_normal(_pool(x, PK.POOL_MAX, (2, 2, 2, 2, 0, 0), 1).shape)
    g = g.astype(np.float32)
    general = _pool_back(g, _layout(x, "strided"), PK.POOL_MAX, (2, 2, 2, 2, 0, 0), n_threads)
    for gl in ("contiguous", "strided", "transposed"):
        fast = _pool_back(_layout(g, gl), x, PK.POOL_MAX, (2, 2, 2, 2, 0, 0), n_threads)
        np.testing.assert_array_equal(fast, general)
    assert not fast[0, 0, :4, :4].any()


def test_pool_2d_back_max_tie_example():
    x = np.array([[[[1, 2, 2], [2, 0, 1], [0, 1, 2]]]], np.float32)
    g = np.array([[[[10.0, 20.0], [30.0, 40.0]]]], np.float32)
    got = _pool_back(g, x, PK.POOL_MAX, (2, 2, 1, 1, 0, 0), 1)
    # Window (0,0) holds 2 at (0,1) and at (1,0); ky is the outer scan, so (0,1) wins it, as
    # it wins window (0,1) over the tie at (0,2): cell (0,1) gets 10 + 20.
    expected = [[[[0, 30, 0], [30, 0, 0], [0, 0, 40]]]]
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


@pytest.mark.parametrize(("cfg", "n_windows"), [((2, 2, 2, 2, 0, 0), 1), ((3, 3, 2, 2, 1, 1), 2)])
def test_pool_2d_back_max_drops_gradient_of_windows_without_maximum(cfg, n_windows):
    x = _nan_inf_plane()
    g = np.ones(_pool(x, PK.POOL_MAX, cfg, 1).shape, np.float32)
    got = _pool_back(g, x, PK.POOL_MAX, cfg, 1)
    expected = np.zeros_like(x)
    expected[0, 0, 0, 1] = n_windows
    np.testing.assert_array_equal(got, expected)


def test_pool_2d_back_avg_spreads_over_in_bounds_cells():
    x = np.zeros((1, 1, 3, 3), np.float32)
    g = np.ones((1, 1, 2, 2), np.float32)
    got = _pool_back(g, x, PK.POOL_AVG, (3, 3, 2, 2, 1, 1), 1)
    counts = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32)
    np.testing.assert_allclose(got[0, 0], counts / 9, rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 1, 1), (1, 2, 1, 5), (3, 1, 2, 1)])
@pytest.mark.parametrize("cfg", [(3, 3, 1, 1, 1, 1, 1, 1), (3, 2, 2, 1, 2, 1, 1, 1)])
def test_im2col_and_back_on_inputs_smaller_than_the_kernel(shape, cfg):
    rng = np.random.default_rng(12)
    x = rng.standard_normal(shape).astype(np.float32)
    cols = _im2col(x, cfg, 2)
    np.testing.assert_array_equal(cols, im2col_ref(x, *cfg))
    g = rng.standard_normal(cols.shape).astype(np.float32)
    got = _im2col_back(g, shape, cfg, 2)
    np.testing.assert_allclose(got, im2col_back_ref(g, shape, *cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [PK.POOL_MAX, PK.POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("shape", [(2, 3, 1, 1), (1, 2, 1, 5), (3, 1, 5, 1)])
@pytest.mark.parametrize("cfg", [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 1, 1)])
def test_pool_2d_and_back_on_inputs_smaller_than_the_window(cfg, shape, op):
    # ggml's float-truncated size gives one clipped window along a 1-pixel axis.
    rng = np.random.default_rng(13)
    x = rng.standard_normal(shape).astype(np.float32)
    out = _pool(x, op, cfg, 2)
    np.testing.assert_allclose(out, pool_ref(x, op, *cfg), rtol=1e-6)
    g = rng.standard_normal(out.shape).astype(np.float32)
    got = _pool_back(g, x, op, cfg, 2)
    np.testing.assert_allclose(got, pool_back_ref(g, x, op, *cfg), rtol=1e-6, atol=1e-7)
