"""ggopt._kernels._elementwise against NumPy: odd sizes, views, tiling, aliasing, 1-2 threads."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _elementwise as E
from ggopt.errors import ShapeError
from tests.support.helpers import layout
from tests.support.sizes import KERNEL_BIG

SHAPE = (7, 13, 3, 5)
BIG = KERNEL_BIG  # 270,000 elements: enough for the kernels to start threads
THREADS = [1, 2]
LAYOUTS = ["contiguous", "strided", "permuted", "padded_rows", "reversed", "readonly"]

BINARY = {E.BIN_ADD: np.add, E.BIN_SUB: np.subtract, E.BIN_MUL: np.multiply, E.BIN_DIV: np.divide}


def unary_ref(uop: int, x: np.ndarray) -> np.ndarray:
    """float64 reference of each unary op."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return {
            E.UN_NEG: lambda: -x,
            E.UN_EXP: lambda: np.exp(x),
            E.UN_LOG: lambda: np.log(x),
            E.UN_SQR: lambda: x * x,
            E.UN_SQRT: lambda: np.sqrt(x),
            E.UN_RELU: lambda: np.where(x > 0, x, 0.0),
            E.UN_GELU: lambda: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
            E.UN_SILU: lambda: x / (1 + np.exp(-x)),
            E.UN_TANH: lambda: np.tanh(x),
            E.UN_SIGMOID: lambda: 1 / (1 + np.exp(-x)),
            E.UN_STEP: lambda: np.where(x > 0, 1.0, 0.0),
            E.UN_ABS: lambda: np.abs(x),
        }[uop]()


def unary_deriv_ref(uop: int, x: np.ndarray) -> np.ndarray:
    """float64 reference derivative of each differentiable unary op."""
    x = x.astype(np.float64)
    k, a = np.sqrt(2 / np.pi), 0.044715
    s = 1 / (1 + np.exp(-x))
    t = np.tanh(k * (x + a * x**3))
    return {
        E.UN_NEG: lambda: -np.ones_like(x),
        E.UN_EXP: lambda: np.exp(x),
        E.UN_LOG: lambda: 1 / x,
        E.UN_SQR: lambda: 2 * x,
        E.UN_SQRT: lambda: 0.5 / np.sqrt(x),
        E.UN_RELU: lambda: (x > 0).astype(np.float64),
        E.UN_GELU: lambda: 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * a * x * x),
        E.UN_SILU: lambda: s * (1 + x * (1 - s)),
        E.UN_TANH: lambda: 1 - np.tanh(x) ** 2,
        E.UN_SIGMOID: lambda: s * (1 - s),
        E.UN_ABS: lambda: np.sign(x),
    }[uop]()


EXACT_UNARY = {E.UN_NEG, E.UN_SQR, E.UN_SQRT, E.UN_RELU, E.UN_STEP, E.UN_ABS}
ALL_UNARY = sorted(v for k, v in vars(E).items() if k.startswith("UN_") and isinstance(v, int))
POSITIVE_DOMAIN = {E.UN_LOG, E.UN_SQRT}


def unary_input(rng: np.random.Generator, uop: int, shape=SHAPE) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32) * 3
    if uop in POSITIVE_DOMAIN:
        x = np.abs(x) + np.float32(0.01)
    return x


def test_op_codes_are_distinct():
    assert len(set(BINARY)) == 4
    assert len(ALL_UNARY) == 12


# ---------------------------------------------------------------------------------------------
# binary


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("la", LAYOUTS)
def test_binary_same_shape_layouts(rng, op, la, n_threads):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    b = rng.standard_normal(SHAPE).astype(np.float32) + np.float32(4)
    for lb in ("contiguous", "permuted"):
        for ld in ("contiguous", "strided", "reversed"):
            dst = layout(np.zeros(SHAPE, np.float32), ld)
            E.binary(op, layout(a, la), layout(b, lb), dst, n_threads)
            np.testing.assert_array_equal(dst, BINARY[op](a, b))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize(
    "bshape",
    [(1, 1, 1, 5), (7, 13, 3, 1), (1, 13, 1, 1), (7, 1, 3, 5), (1, 1, 1, 1), (7, 13, 1, 5)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(rng, op, bshape, n_threads):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32) + np.float32(4)
    for lb in ("contiguous", "strided", "permuted"):
        dst = np.zeros(SHAPE, np.float32)
        E.binary(op, layout(a, "padded_rows"), layout(b, lb), dst, n_threads)
        np.testing.assert_array_equal(dst, BINARY[op](a, b))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("bshape", [(1, 13, 1, 1), (7, 1, 1, 1), (7, 13, 1, 1), (1, 1, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("size", ["small", "big"])
def test_binary_per_plane_broadcast(rng, bshape, size, n_threads):
    """One b value per dense (i3, i2) plane (a conv bias): each plane runs as one row, also when
    a thread's range starts or ends inside a plane."""
    shape = SHAPE if size == "small" else (7, 13, 43, 71)  # above the parallel threshold
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    for ld in ("contiguous", "strided"):
        dst = layout(np.zeros(shape, np.float32), ld)
        E.binary(E.BIN_ADD, a, b, dst, n_threads)
        np.testing.assert_array_equal(dst, a + b)
        E.binary(E.BIN_DIV, a[:, :, ::2], b, dst[:, :, ::2], n_threads)  # rows far apart
        np.testing.assert_array_equal(dst[:, :, ::2], a[:, :, ::2] / b)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("la", ["contiguous", "strided"])
def test_binary_tiling(rng, la, n_threads):
    # ggml's repeat broadcast: b's dims divide a's without being 1
    ashape, bshape = (4, 6, 9, 10), (2, 3, 3, 5)
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    reps = tuple(n // m for n, m in zip(ashape, bshape, strict=True))
    for op in sorted(BINARY):
        dst = np.zeros(ashape, np.float32)
        E.binary(op, layout(a, la), layout(b, la), dst, n_threads)
        np.testing.assert_array_equal(dst, BINARY[op](a, np.tile(b, reps)))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("bshape", [BIG, (1, 1, 1, BIG[3]), (1, 3, 1, 25)])
def test_binary_large(rng, bshape, n_threads):
    a = rng.standard_normal(BIG).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    reps = tuple(n // m for n, m in zip(BIG, bshape, strict=True))
    for la in ("contiguous", "strided"):
        dst = np.zeros(BIG, np.float32)
        E.binary(E.BIN_MUL, layout(a, la), b, dst, n_threads)
        np.testing.assert_array_equal(dst, a * np.tile(b, reps))


@pytest.mark.parametrize("n_threads", THREADS)
def test_binary_in_place(rng, n_threads):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    b = rng.standard_normal(SHAPE).astype(np.float32)
    row = rng.standard_normal((1, 1, 1, 5)).astype(np.float32)
    for la in ("contiguous", "strided", "permuted"):
        x = layout(a, la)
        E.binary(E.BIN_ADD, x, row, x, n_threads)  # dst is a
        np.testing.assert_array_equal(x, a + row)
        y = layout(b, la)
        E.binary(E.BIN_SUB, x, y, y, n_threads)  # dst is b
        np.testing.assert_array_equal(y, (a + row) - b)
        E.binary(E.BIN_MUL, x, x, x, n_threads)  # a, b and dst all the same
        np.testing.assert_array_equal(x, (a + row) * (a + row))


def test_binary_errors_leave_dst_untouched(rng):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    dst = np.full(SHAPE, 7, np.float32)
    with pytest.raises(ShapeError, match="divide"):
        E.binary(E.BIN_ADD, a, np.ones((1, 1, 2, 5), np.float32), dst, 1)
    narrow = np.full((7, 13, 3, 4), 7, np.float32)
    with pytest.raises(ShapeError, match="dst"):
        E.binary(E.BIN_ADD, a, a, narrow, 1)
    np.testing.assert_array_equal(narrow, 7)
    with pytest.raises(ShapeError, match="op code"):
        E.binary(9, a, a, dst, 1)
    with pytest.raises(ValueError):  # the dtype is checked by the memoryview
        E.binary(E.BIN_ADD, a.astype(np.float64), a, dst, 1)
    np.testing.assert_array_equal(dst, 7)


def test_binary_empty():
    # dst is an empty window into a guarded buffer: nothing may be written around it
    guard = np.full(32, 7.0, np.float32)
    a = np.zeros((0, 3, 1, 5), np.float32)
    b = np.ones((1, 1, 1, 5), np.float32)
    dst = guard[8:8].reshape(0, 3, 1, 5)
    assert E.binary(E.BIN_ADD, a, b, dst, 2) is None
    assert (guard == 7.0).all() and (b == 1.0).all() and dst.shape == (0, 3, 1, 5)
    with pytest.raises(ShapeError):  # an empty a still needs a dst of its shape
        E.binary(E.BIN_ADD, a, b, guard[:15].reshape(1, 3, 1, 5), 2)
    assert (guard == 7.0).all()


# ---------------------------------------------------------------------------------------------
# unary


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("uop", ALL_UNARY)
def test_unary_layouts(rng, uop, n_threads):
    x = unary_input(rng, uop)
    expect = unary_ref(uop, x)
    for lx in LAYOUTS:
        for ld in ("contiguous", "strided"):
            dst = layout(np.zeros(SHAPE, np.float32), ld)
            E.unary(uop, layout(x, lx), dst, n_threads)
            if uop in EXACT_UNARY:
                np.testing.assert_array_equal(dst, expect.astype(np.float32))
            else:
                np.testing.assert_allclose(dst, expect, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("uop", ALL_UNARY)
def test_unary_large_threaded_and_in_place(rng, uop):
    x = unary_input(rng, uop, BIG)
    expect = unary_ref(uop, x)
    y = x.copy()
    E.unary(uop, y, y, 2)
    np.testing.assert_allclose(y, expect, rtol=1e-6, atol=1e-7)


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.8, -104.0, 1e-30], np.float32)
    x = x.reshape(1, 1, 1, -1)
    out = np.empty_like(x)
    E.unary(E.UN_EXP, x, out, 1)
    np.testing.assert_array_equal(out.ravel()[:4], [1, 1, np.inf, 0])
    assert np.isnan(out.ravel()[4]) and out.ravel()[5] == np.inf and out.ravel()[6] == 0
    E.unary(E.UN_RELU, x, out, 1)  # ggml: x > 0 ? x : 0, so NaN gives 0
    np.testing.assert_array_equal(out.ravel(), np.float32([0, 0, np.inf, 0, 0, 88.8, 0, 1e-30]))
    E.unary(E.UN_STEP, x, out, 1)
    np.testing.assert_array_equal(out.ravel(), [0, 0, 1, 0, 0, 1, 0, 1])
    E.unary(E.UN_SIGMOID, x, out, 1)
    np.testing.assert_array_equal(out.ravel()[[2, 3, 5, 6]], [1, 0, 1, 0])
    E.unary(E.UN_GELU, x, out, 1)
    np.testing.assert_array_equal(out.ravel()[[0, 2, 5]], [0, np.inf, np.float32(88.8)])
    assert np.isnan(out.ravel()[4])


def test_exp_is_accurate_over_its_range():
    x = np.linspace(-87, 88.7, 400_003, dtype=np.float32).reshape(1, 1, 1, -1)
    out = np.empty_like(x)
    E.unary(E.UN_EXP, x, out, 2)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=2.5e-7)


def _expf_model(x: np.ndarray) -> np.ndarray:
    """ggopt_expf (_kernels/scalar_math.h) in NumPy float32, operation for operation."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        xc = np.where(x > f32(89), f32(89), x)
        xc = np.where(xc < f32(-104), f32(-104), xc)
        t = xc * f32(1.44269504088896341)
        t = np.where(t == t, t, f32(0))
        fn = (t + f32(12582912)) - f32(12582912)
        r = xc - fn * f32(0.693359375)
        r = r - fn * f32(-2.12194440e-4)
        z = r * r
        p = np.full_like(x, f32(1.9875691500e-4))
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                  5.0000001201e-1):
            p = p * r + f32(c)
        p = p * z + r + f32(1)
        n = fn.astype(np.int32)
        n1 = n >> 1
        s1 = ((n1 + 127) << 23).view(np.float32)
        s2 = ((n - n1 + 127) << 23).view(np.float32)
        return p * s1 * s2


def test_exp_is_its_numpy_model_bit_for_bit():
    """Every 4099th float32 bit pattern (all signs, exponents, subnormals, infinities and
    NaNs) and the floats next to the clamps (89, -104) and to where the result leaves the
    normal range: the kernel's bits are the model's (NaN stays NaN)."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.float32([89, -104, 88.72284, -87.33655, -103.97208, 0])
    near = (edges.view(np.int32)[:, None] + np.arange(-300, 301, dtype=np.int32)).ravel()
    x = np.concatenate([bits.view(np.float32), near.view(np.float32)]).reshape(1, 1, 1, -1)
    out = np.empty_like(x)
    E.unary(E.UN_EXP, x, out, 2)
    want = _expf_model(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_unary_errors(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x_before, dst, wide = x.copy(), np.full(SHAPE, 7, np.float32), np.full((7, 13, 3, 6), 7,
                                                                          np.float32)
    with pytest.raises(ShapeError, match="unary op code"):
        E.unary(-2, x, dst, 1)
    with pytest.raises(ShapeError, match="dst"):
        E.unary(E.UN_NEG, x, wide, 1)
    np.testing.assert_array_equal(dst, 7)
    np.testing.assert_array_equal(wide, 7)
    np.testing.assert_array_equal(x, x_before)


# ---------------------------------------------------------------------------------------------
# unary_back

DIFFERENTIABLE = [u for u in ALL_UNARY if u != E.UN_STEP]


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("uop", DIFFERENTIABLE)
def test_unary_back_analytic(rng, uop, n_threads):
    x = unary_input(rng, uop)
    g = rng.standard_normal(SHAPE).astype(np.float32)
    expect = g * unary_deriv_ref(uop, x)
    for lx, lg in [("contiguous", "contiguous"), ("strided", "permuted"), ("reversed", "readonly")]:
        dst = np.zeros(SHAPE, np.float32)
        E.unary_back(uop, layout(x, lx), layout(g, lg), dst, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("uop", DIFFERENTIABLE)
def test_unary_back_finite_differences(rng, uop):
    # the derivative the kernel uses matches the kernel's own forward pass
    x = rng.uniform(-2.5, 2.5, (1, 1, 1, 200)).astype(np.float64)
    if uop in POSITIVE_DOMAIN:
        x = np.abs(x) + 0.5
    x = x[np.abs(x) > 0.05].reshape(1, 1, 1, -1)  # away from the kinks of relu and abs
    h = 1e-2

    def f(v):
        out = np.empty(v.shape, np.float32)
        E.unary(uop, v.astype(np.float32), out, 1)
        return out.astype(np.float64)

    numeric = (f(x + h) - f(x - h)) / (2 * h)
    x32 = x.astype(np.float32)
    analytic = np.empty_like(x32)
    E.unary_back(uop, x32, np.ones_like(x32), analytic, 1)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-3, atol=2e-3)


def test_unary_back_kinks_and_in_place():
    x = np.array([-1.0, 0.0, 2.0], np.float32).reshape(1, 1, 1, 3)
    g = np.array([5.0, 5.0, 5.0], np.float32).reshape(1, 1, 1, 3)
    out = np.empty_like(x)
    E.unary_back(E.UN_RELU, x, g, out, 1)
    np.testing.assert_array_equal(out.ravel(), [0, 0, 5])
    E.unary_back(E.UN_ABS, x, g, out, 1)
    np.testing.assert_array_equal(out.ravel(), [-5, 0, 5])
    E.unary_back(E.UN_SQR, x, g, g, 1)  # dst is g
    np.testing.assert_array_equal(g.ravel(), [-10, 0, 20])


def test_unary_back_large_threaded(rng):
    x = rng.standard_normal(BIG).astype(np.float32)
    g = rng.standard_normal(BIG).astype(np.float32)
    out = np.empty_like(x)
    E.unary_back(E.UN_GELU, x, g, out, 2)
    np.testing.assert_allclose(out, g * unary_deriv_ref(E.UN_GELU, x), rtol=2e-6, atol=1e-6)


def test_unary_back_errors(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x_before, dst = x.copy(), np.full(SHAPE, 7, np.float32)
    with pytest.raises(ShapeError, match="UN_STEP"):
        E.unary_back(E.UN_STEP, x, x, dst, 1)
    with pytest.raises(ShapeError, match="g"):
        E.unary_back(E.UN_RELU, x, x[:, :, :2], dst, 1)
    np.testing.assert_array_equal(dst, 7)
    np.testing.assert_array_equal(x, x_before)


# ---------------------------------------------------------------------------------------------
# scale


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG])
def test_scale(rng, shape, n_threads):
    a = rng.standard_normal(shape).astype(np.float32)
    s, bias = np.float32(0.37), np.float32(-1.25)
    for la in LAYOUTS:
        dst = layout(np.zeros(shape, np.float32), "strided" if la == "permuted" else "contiguous")
        E.scale(layout(a, la), dst, s, bias, n_threads)
        np.testing.assert_array_equal(dst, s * a + bias)
    expect = s * a
    E.scale(a, a, s, 0.0, n_threads)  # in place
    np.testing.assert_array_equal(a, expect)
