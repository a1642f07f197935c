"""ggml's float order (``_kernels/_ggml_order``) against NumPy models of the rounding of
llama.cpp's x86 AVX2+FMA build, bit for bit: ggml_v_expf's polynomial, hsum_float_8's
pairing, ggml_vec_dot_f32's four sums and GGML_F32x8_REDUCE, tinyBLAS's one sum, the quantized
vec_dots' 8 lanes of 4 integer products, the double sums of rms_norm and softmax. Each kernel
runs as the AVX2 version and forced lane by lane, on 1, 2 and 3 threads: the same bits.
(The same kernels against the ggml library itself: test_ggml_order_interop.py.)"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from ggopt import quants
from ggopt._kernels import _ggml_order as go
from ggopt._kernels import _quant_dot
from ggopt.errors import DTypeError
from ggopt.types import GGType
from tests.support.ggml_order import fma, hsum8, mm_f32, softmax

f32 = np.float32

_LIBM = ctypes.util.find_library("m")
pytestmark = pytest.mark.skipif(_LIBM is None, reason="the C library's expf (libm) is needed")



def _libm_expf() -> np.ufunc:
    lib = ctypes.CDLL(_LIBM)
    lib.expf.restype, lib.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.frompyfunc(lambda v: f32(lib.expf(float(v))), 1, 1)


EXPF = _libm_expf() if _LIBM else None


def expf(x: np.ndarray) -> np.ndarray:
    return np.asarray(EXPF(np.asarray(x, f32)), f32)


def _h(text: str) -> np.float32:
    return f32(float.fromhex(text))


# ggml_v_expf's constants
R, LOG2E, LN2_HI, LN2_LO = _h("0x1.8p23"), _h("0x1.715476p+0"), _h("0x1.62e4p-1"), \
    _h("0x1.7f7d1cp-20")
C4, C3, C2, C1, C0 = (_h("0x1.0e4020p-7"), _h("0x1.573e2ep-5"), _h("0x1.555e66p-3"),
                      _h("0x1.fffdb6p-2"), _h("0x1.ffffecp-1"))


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX2), lane by lane."""
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        z = fma(x, LOG2E, R)
        n = (z - R).astype(f32)
        b = fma(-n, LN2_LO, fma(-n, LN2_HI, x))
        e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
        k = (e + np.uint32(0x3F800000)).view(f32)
        u = (b * b).astype(f32)
        j = fma(fma(fma(C4, b, C3), u, fma(C2, b, C1)), u, (C0 * b).astype(f32))
        plain = fma(k, j, k)
        g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
        s1 = (g + np.uint32(0x7F000000)).view(f32)
        s2 = (e - g).astype(np.uint32).view(f32)
        scaled = (fma(s2, j, s2) * s1).astype(f32)
        return np.where(np.abs(n) > 192, (s1 * s1).astype(f32),
                        np.where(np.abs(n) > 126, scaled, plain)).astype(f32)


def softmax_model(x: np.ndarray, mask: np.ndarray | None, scale: float,
                  padded: bool = False) -> np.ndarray:
    n = x.size
    w = (x * f32(scale)).astype(f32)
    if mask is not None:
        w = (w + mask).astype(f32)
    nw = -(-n // 8) * 8 if padded else n
    w = np.concatenate([w, np.full(nw - n, -np.inf, f32)])
    mx = f32(-np.inf)
    for v in w:
        mx = mx if mx > v else v
    nv = nw // 8 * 8
    with np.errstate(invalid="ignore"):
        y = np.concatenate([v_expf((w[:nv] - mx).astype(f32)), expf((w[nv:] - mx).astype(f32))])
    total = 0.0
    for i in range(0, nv, 8):
        total += float(hsum8(y[i:i + 8]))
    for v in y[nv:]:
        total += float(v)
    return (y[:n] * f32(1.0 / total)).astype(f32)


def swiglu_model(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    n8 = x.size // 8 * 8
    with np.errstate(all="ignore"):
        head = (x[:n8] / (f32(1) + v_expf((f32(0) - x[:n8]).astype(f32))) * g[:n8]).astype(f32)
        tail = (x[n8:] / (f32(1) + expf(-x[n8:])) * g[n8:]).astype(f32)
    return np.concatenate([head, tail])


def rms_norm_model(x: np.ndarray, eps: float) -> np.ndarray:
    total = np.cumsum((x * x).astype(f32).astype(np.float64))[-1]
    mean = f32(total / x.size)
    return (x * (f32(1) / np.sqrt(f32(mean + f32(eps)), dtype=f32))).astype(f32)


def dot_vec_model(x: np.ndarray, y: np.ndarray) -> np.float32:
    n = x.size
    np_ = n // 32 * 32
    s = np.zeros((4, 8), f32)
    for i in range(0, np_, 32):
        for q in range(4):
            s[q] = fma(x[i + 8 * q:i + 8 * q + 8], y[i + 8 * q:i + 8 * q + 8], s[q])
    t = ((s[0] + s[2]).astype(f32) + (s[1] + s[3]).astype(f32)).astype(f32)
    u = [f32(t[k] + t[k + 4]) for k in range(4)]
    r = f32(f32(u[0] + u[1]) + f32(u[2] + u[3]))
    p = np_ + (n - np_) // 4 * 4
    for i in range(np_, p):
        r = f32(r + f32(x[i] * y[i]))
    for i in range(p, n):
        r = fma(x[i], y[i], r)[()]
    return r


def dot_tiny_model(x: np.ndarray, y: np.ndarray) -> np.float32:
    n = -(-x.size // 8) * 8
    xp, yp = (np.concatenate([v, np.zeros(n - v.size, f32)]) for v in (x, y))
    s = np.zeros(8, f32)
    for i in range(0, n, 8):
        s = fma(xp[i:i + 8], yp[i:i + 8], s)
    return hsum8(s)


def _codes(raw_row: np.ndarray, qtype: GGType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A row's codes (blocks x 32, natural order), d and m (zeros without one)."""
    bb = {GGType.Q4_0: 18, GGType.Q4_1: 20, GGType.Q5_0: 22, GGType.Q5_1: 24, GGType.Q8_0: 34}
    blocks = raw_row.reshape(-1, bb[qtype])
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16)[:, 0].astype(f32)
    m = np.zeros_like(d)
    if qtype == GGType.Q8_0:
        return blocks[:, 2:].view(np.int8).astype(np.int32), d, m
    unsigned = qtype in (GGType.Q4_1, GGType.Q5_1)
    if unsigned:
        m = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16)[:, 0].astype(f32)
    five = qtype in (GGType.Q5_0, GGType.Q5_1)
    at = 2 + 2 * unsigned + 4 * five
    qs = blocks[:, at:at + 16].astype(np.int32)
    c = np.concatenate([qs & 15, qs >> 4], axis=1)
    if five:
        qh = np.ascontiguousarray(blocks[:, at - 4:at]).view(np.uint32)[:, 0]
        c |= (((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)
    off = 0 if unsigned else (16 if five else 8)
    return c - off, d, m


def qdot_model(raw: np.ndarray, qtype: GGType, x: np.ndarray) -> np.ndarray:
    n, k = x.shape
    vt = 2 if qtype == GGType.Q8_0 else int(qtype)  # Q8_0's codes unbiased
    q = np.empty((n, k), np.int8)
    d, s = np.empty((n, k // 32), f32), np.empty((n, k // 32), f32)
    _quant_dot.quantize_activations(x, vt, q, d, s, np.empty((n, k // 16), np.int32), 1)
    out = np.empty((n, raw.shape[0]), f32)
    for r in range(raw.shape[0]):
        c, dw, mw = _codes(raw[r], qtype)
        for t in range(n):
            qy = q[t].reshape(-1, 32).astype(np.int32)
            lanes = (c * qy).reshape(-1, 8, 4).sum(-1).astype(f32)  # exact integers
            acc, summs = np.zeros(8, f32), f32(0)
            for i in range(c.shape[0]):
                acc = fma(f32(dw[i] * d[t, i]), lanes[i], acc)
                if qtype in (GGType.Q4_1, GGType.Q5_1):
                    summs = fma(mw[i], s[t, i], summs)[()]
            out[t, r] = f32(hsum8(acc) + summs)
    return out


def assert_bits_equal(a, b) -> None:
    np.testing.assert_array_equal(np.asarray(a, f32).view(np.int32),
                                  np.asarray(b, f32).view(np.int32))


def test_exp_polynomial_over_its_range(path):
    # through softmax rows whose max is 0: exp of every argument down to the flushed ones
    # (-inf included), the scaled path below -87
    y = np.concatenate([np.zeros(8, f32), np.linspace(-120, 0, 8 * 500, dtype=f32),
                        np.array([-87.3, -103.97, -104, -150, -200, -np.inf, -0.0, -1e-30],
                                 f32)])[None]
    got = np.empty_like(y)
    softmax(y, None, got, 1.0, 1)
    assert_bits_equal(got[0], softmax_model(y[0], None, 1.0))
    # through swiglu: exp(-x) for large positive and negative x (overflow to inf: silu 0)
    x = np.concatenate([np.linspace(-100, 100, 8 * 500, dtype=f32),
                        np.array([88.7, -88.7, 89.0, -89.0, 1e4, -1e4, 0.0, -0.0], f32)])[None]
    g = np.ones_like(x)
    out = np.empty_like(x)
    go.swiglu_rows(x, g, out, 1)
    assert_bits_equal(out[0], swiglu_model(x[0], g[0]))


def test_nan_rows_stay_nan(path):
    x = np.array([[1.0, np.nan, 2.0, 3.0, 0.5, -1.0, 4.0, 2.0, 1.0]], f32)
    out = np.empty_like(x)
    softmax(x, None, out, 1.0, 1)
    assert np.isnan(out).all()


@pytest.mark.parametrize("n", [1, 5, 8, 13, 64, 131])
@pytest.mark.parametrize("padded", [False, True])
def test_softmax_is_its_model(path, n, padded):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n)) * 6).astype(f32)
    mask = np.where(rng.random((3, n)) < 0.3, f32(-np.inf), f32(0)).astype(f32)
    mask[:, 0] = 0
    out = np.empty_like(x)
    softmax(x, mask, out, 0.125, 2, padded)
    for r in range(3):
        assert_bits_equal(out[r], softmax_model(x[r], mask[r], 0.125, padded))


@pytest.mark.parametrize("n", [3, 8, 1536, 1001])
def test_swiglu_is_its_model(path, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((2, n)) * 8).astype(f32)
    x[0, :3] = [100.0, -100.0, 0.0]
    g = rng.standard_normal((2, n)).astype(f32)
    out = np.empty_like(x)
    go.swiglu_rows(x, g, out, 2)
    for r in range(2):
        assert_bits_equal(out[r], swiglu_model(x[r], g[r]))


def test_rms_norm_sums_in_double_one_after_the_other(path):
    # many small rows: the F32 mean and the F32 `mean + eps` round where a double sum would not
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3000, 7)) * np.logspace(-3, -1, 7)).astype(f32)
    x[:2] = (rng.standard_normal((2, 7)) * 1e3).astype(f32)
    out = np.empty_like(x)
    go.rms_norm_rows(x, out, 1e-5, 2)
    assert_bits_equal(out, np.stack([rms_norm_model(r, 1e-5) for r in x]))
    wide = (rng.standard_normal((4, 577)) * np.logspace(-3, 3, 577)).astype(f32)
    out = np.empty_like(wide)
    go.rms_norm_rows(wide, out, 1e-5, 2)
    assert_bits_equal(out, np.stack([rms_norm_model(r, 1e-5) for r in wide]))


@pytest.mark.parametrize("k", [1, 7, 8, 31, 32, 33, 64, 67, 100, 256, 259])
def test_f32_dots_in_both_orders(path, k):
    rng = np.random.default_rng(k)
    a = (rng.standard_normal((11, k)) * rng.uniform(0.01, 100, (11, 1))).astype(f32)
    b = rng.standard_normal((3, k)).astype(f32)
    for tiny, model in ((False, dot_vec_model), (True, dot_tiny_model)):
        out = np.empty((3, 11), f32)
        mm_f32(a, b, out, tiny, 2)
        want = np.array([[model(a[i], b[j]) for i in range(11)] for j in range(3)], f32)
        assert_bits_equal(out, want)


@pytest.mark.parametrize("qtype", [GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1,
                                   GGType.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 11])  # one token, a few (each alone), 8 + 3 (tiles)
def test_quantized_products_are_their_model(path, qtype, n):
    rng = np.random.default_rng(int(qtype))
    raw = quants.quantize((rng.standard_normal((9, 96)) * rng.uniform(0.1, 3, (9, 1)))
                          .astype(f32), qtype)
    x = (rng.standard_normal((n, 96)) * np.linspace(0.1, 20, 96)).astype(f32)
    out = np.empty((n, 9), f32)
    go.mul_mat_quant(raw, int(qtype), x, out, 2)
    assert_bits_equal(out, qdot_model(raw, qtype, x))


def test_bits_do_not_depend_on_threads_or_the_path():
    # every call is large enough to take all its threads (min_parallel_work(2**15) work)
    rng = np.random.default_rng(5)
    raw = quants.quantize(rng.standard_normal((40, 128)).astype(f32), GGType.Q4_1)
    x = rng.standard_normal((67, 128)).astype(f32)
    g = rng.standard_normal((67, 128)).astype(f32)
    a = rng.standard_normal((37, 64)).astype(f32)
    results = []
    for portable in ((False, True) if go.vector() else (True,)):
        go.force_portable(portable)
        try:
            for nt in (1, 2, 3):
                q, f = np.empty((67, 40), f32), np.empty((67, 37), f32)
                s, w, r = (np.empty((67, 128), f32) for _ in range(3))
                go.mul_mat_quant(raw, int(GGType.Q4_1), x, q, nt)
                mm_f32(a, x[:, :64], f, True, nt)
                softmax(x, None, s, 0.5, nt, True)
                go.swiglu_rows(x, g, w, nt)
                go.rms_norm_rows(x, r, 1e-5, nt)
                results.append(np.concatenate([v.ravel() for v in (q, f, s, w, r)]))
        finally:
            go.force_portable(False)
    for r in results[1:]:
        assert_bits_equal(r, results[0])


@pytest.mark.parametrize("qtype", [GGType.Q4_0, GGType.Q8_0], ids=lambda t: t.name)
def test_non_finite_activations_give_the_same_numbers_on_both_paths(qtype):
    """A NaN or infinite activation rounds to code -128 (as ggml's); ggml's sign trick leaves
    -128 negated as -128, and the lane-by-lane version computes the same."""
    if not go.vector():
        pytest.skip("the CPU has no AVX2 and FMA")
    rng = np.random.default_rng(9)
    raw = quants.quantize(rng.standard_normal((5, 64)).astype(f32), qtype)
    x = rng.standard_normal((9, 64)).astype(f32)
    x[0, 3], x[1, 40], x[2, 7] = np.nan, np.inf, -np.inf
    outs = []
    for portable in (False, True):
        go.force_portable(portable)
        try:
            out = np.empty((9, 5), f32)
            go.mul_mat_quant(raw, int(qtype), x, out, 1)
            outs.append(out)
        finally:
            go.force_portable(False)
    np.testing.assert_array_equal(outs[0], outs[1])  # NaN where NaN; the numbers equal


def test_shapes_and_types_are_checked_before_writing():
    x = np.ones((2, 64), f32)
    out = np.full((2, 3), 7, f32)
    with pytest.raises(DTypeError, match="no ggml-order product"):
        go.mul_mat_quant(np.zeros((3, 128), np.uint8), int(GGType.F16), x, out, 1)
    with pytest.raises(ValueError, match="not 64 elements"):
        go.mul_mat_quant(np.zeros((3, 19), np.uint8), int(GGType.Q4_1), x, out, 1)
    with pytest.raises(ValueError, match="unit stride"):
        softmax(np.ones((4, 4), f32)[:, ::2], None, np.empty((4, 2), f32), 1.0, 1)
    y = np.full((1, 2, 3, 8), 7, f32)
    with pytest.raises(ValueError, match="does not broadcast"):  # 2 heads over a mask of 3
        go.soft_max_rows(np.ones((1, 2, 3, 8), f32), np.zeros((1, 3, 3, 8), f32), y, 1.0, 1)
    assert (y == 7).all()
    with pytest.raises(ValueError):
        mm_f32(np.ones((3, 8), f32), np.ones((2, 9), f32), out, True, 1)
    w = quants.quantize(np.ones((2, 64), f32), GGType.Q8_0)
    with pytest.raises(ValueError, match="unit stride"):  # one row read backwards
        go.mul_mat_quant(w[:1, ::-1], int(GGType.Q8_0), x, out[:, :1], 1)
    odd = np.full(2 * 5 + 1, 7, f32).view(np.uint8)[2:2 + 2 * 18].view(np.float32)
    with pytest.raises(ValueError, match="whole floats"):  # rows 18 bytes apart
        go.mul_mat_quant(w, int(GGType.Q8_0), x, np.lib.stride_tricks.as_strided(
            odd, (2, 2), (18, 4)), 1)
    assert (out == 7).all()
