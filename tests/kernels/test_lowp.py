"""_lowp.pyx's packed BF16/F16 GEMM against NumPy references that round as ggml does: the
exact summation order (BF16: vdpbf16ps's pairs, odd element first; F16: k ascending) gives the
same bits on ordinary data, a float64 product bounds the error; the hardware kernel and the
forced portable one give the same bits on random and adversarial data (subnormals, infinities,
NaNs); odd sizes, strided and transposed operands, 1/2/3 threads."""

from __future__ import annotations

import ggopt._kernels._lowp as _lowp
import numpy as np
import pytest

from ggopt.errors import DTypeError, InvalidValueError, ShapeError
from ggopt.lowp import bf16_from_f32, f32_from_bf16, round_to
from ggopt.types import BF16, F16

SIZES = [(1, 1, 1), (1, 3, 2), (3, 17, 5), (17, 1, 33), (9, 49, 64), (8, 48, 31), (20, 100, 7)]


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _bits(t, w: np.ndarray) -> np.ndarray:
    return bf16_from_f32(w) if t is BF16 else w.astype(np.float16).view(np.uint16)


def _values(t, bits: np.ndarray) -> np.ndarray:
    return f32_from_bf16(bits) if t is BF16 else bits.view(np.float16).astype(np.float32)


def _gemm(t, w, x, n_threads=2, kernel=None, transposed=False, out=None):
    out = np.full((x.shape[0], w.shape[1] if transposed else w.shape[0]), np.nan, np.float32) \
        if out is None else out
    _lowp.set_kernel(kernel)
    try:
        _lowp.lowp_gemm(w, int(t), x, out, n_threads, transposed)
    finally:
        _lowp.set_kernel(None)
    return out


KERNELS = _lowp.available()


def _ordered(t, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The kernel's order in float32 NumPy: one running sum per output; BF16 takes each pair
    (2p, 2p+1) odd element first. Products of two BF16/F16 values are exact in float32, so on
    ordinary data (no underflow) the fused steps equal these multiply-then-adds."""
    xr, wf = round_to(t, x), _values(t, w)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    K = x.shape[1]
    order = [k for p in range(0, K, 2) for k in (p + 1, p) if k < K] if t is BF16 else range(K)
    for k in order:
        acc = acc + np.multiply.outer(xr[:, k], wf[:, k])
    return acc


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("t", [BF16, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_exact_order_and_float64_bound(t, size, kernel):
    n, m, k = size
    w, x = _bits(t, _f32(m, k, seed=1)), _f32(n, k, seed=2)
    got = _gemm(t, w, x, kernel=kernel)
    np.testing.assert_array_equal(got.view(np.uint32), _ordered(t, w, x).view(np.uint32))
    ref = round_to(t, x).astype(np.float64) @ _values(t, w).astype(np.float64).T
    bound = k * np.finfo(np.float32).eps * (np.abs(round_to(t, x)) @ np.abs(_values(t, w)).T)
    assert np.all(np.abs(got - ref) <= bound)


@pytest.mark.parametrize("t", [BF16, F16], ids=lambda t: t.name)
def test_threads_portable_and_transposed_give_the_same_bits(t):
    w, x = _bits(t, _f32(100, 77, seed=3)), _f32(19, 77, seed=4)
    first = _gemm(t, w, x, 1)
    others = [_gemm(t, w, x, 2), _gemm(t, w, x, 3),
              _gemm(t, np.ascontiguousarray(w.T), x, 3, transposed=True)]
    others += [_gemm(t, w, x, n, kernel=k) for k in KERNELS for n in (1, 3)]
    others += [_gemm(t, np.ascontiguousarray(w.T), x, 2, kernel=k, transposed=True)
               for k in KERNELS]
    for got in others:
        np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32))


@pytest.mark.parametrize("kernel", KERNELS)
def test_strided_views_and_a_strided_output(kernel):
    wbig = bf16_from_f32(_f32(40, 90, seed=5))
    xbig = _f32(30, 80, seed=6)
    w, x = wbig[::2, 1:70:2], xbig[::3, ::2][:, :35]        # w (20, 35), x (10, 35)
    out_big = np.full((10, 60), 7.0, np.float32)
    out = out_big[:, ::3]                                  # (10, 20), column stride 3
    _gemm(BF16, w, x, 2, kernel=kernel, out=out)
    np.testing.assert_array_equal(
        out, _ordered(BF16, np.ascontiguousarray(w), np.ascontiguousarray(x)))
    assert np.all(np.delete(out_big, np.s_[::3], axis=1) == 7.0)
    wr, xr = w[::-1, ::-1], x[:, ::-1]                      # negative strides
    want = _ordered(BF16, np.ascontiguousarray(wr), np.ascontiguousarray(xr))
    np.testing.assert_array_equal(_gemm(BF16, wr, xr, kernel=kernel), want)


def _adversarial_bf16(shape, seed):
    """BF16 bits mixing ordinary values with subnormals, zeros of both signs, infinities,
    quiet and signalling NaNs with payloads, and extremes whose products underflow or
    overflow F32."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, shape).astype(np.uint16)      # every kind, uniformly
    normal = bf16_from_f32(rng.standard_normal(shape).astype(np.float32))
    pick = rng.random(shape)
    bits = np.where(pick < 0.6, normal, bits)
    special = np.array([0x0001, 0x807F, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFF81, 0x7F7F,
                        0x0080, 0x1F80, 0x2000, 0xE000], np.uint16)
    return np.where(pick > 0.95, special[rng.integers(0, len(special), shape)], bits)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "portable"])
@pytest.mark.parametrize("seed", range(4))
def test_every_kernel_equals_the_portable_one_on_adversarial_bf16(seed, kernel):
    w = _adversarial_bf16((50, 41), seed)
    x = f32_from_bf16(_adversarial_bf16((13, 41), seed + 100))
    # activations that are not BF16 values round on the way in (subnormal F32 ones too)
    x[::4] = _f32(4, 41, seed=seed) * np.float32(1e-38)
    fast, port = _gemm(BF16, w, x, 2, kernel=kernel), _gemm(BF16, w, x, 3, kernel="portable")
    np.testing.assert_array_equal(fast.view(np.uint32), port.view(np.uint32))
    assert np.isnan(fast).any() and (fast == 0).any() and np.isfinite(fast).any()


def test_kernels_ignore_the_callers_flush_to_zero():
    """vdpbf16ps ignores the MXCSR and the other kernels set or emulate its FTZ/DAZ: the
    flush-to-zero mode of a graph compute changes no bit."""
    from ggopt._kernels._fpmode import ComputeFloatMode, flushing, supported

    if not supported():
        pytest.skip("no flush-to-zero control on this CPU")
    w = _adversarial_bf16((30, 64), 7)
    x = f32_from_bf16(_adversarial_bf16((9, 64), 8))
    plain = _gemm(BF16, w, x, 2, kernel="portable")
    with ComputeFloatMode(2):
        assert flushing()
        got = [_gemm(BF16, w, x, 2, kernel=k) for k in KERNELS]
    for g in got:
        np.testing.assert_array_equal(g.view(np.uint32), plain.view(np.uint32))


def test_kernel_choice():
    assert "portable" in KERNELS and _lowp.kernel(int(BF16)) in KERNELS
    with pytest.raises(InvalidValueError, match="unknown kernel"):
        _lowp.set_kernel("amx")
    assert _lowp.kernel(int(BF16)) in KERNELS  # unchanged by the refusal


def test_empty_and_refused_arguments():
    w, x = np.zeros((4, 6), np.uint16), _f32(3, 6)
    out = np.full((3, 4), 7.0, np.float32)
    _lowp.lowp_gemm(np.zeros((4, 0), np.uint16), 30, np.zeros((3, 0), np.float32), out, 1)
    assert np.all(out == 0)                                 # an empty reduction sums to 0
    with pytest.raises(DTypeError, match="weight type"):
        _lowp.lowp_gemm(w, 8, x, out, 1)
    with pytest.raises(ShapeError, match="do not fit"):
        _lowp.lowp_gemm(w, 30, _f32(3, 5), out, 1)
    with pytest.raises(ShapeError, match="do not fit"):
        _lowp.lowp_gemm(w, 30, x, out, 1, True)
    assert np.all(out == 0)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("t", [BF16, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("transposed", [False, True])
def test_prepacked_panels_give_the_same_bits(t, kernel, transposed):
    w = _bits(t, _f32(61, 77, seed=9))
    w = np.ascontiguousarray(w.T) if transposed else w
    x = _f32(11, 77, seed=10)
    packed = _lowp.lowp_pack(w, int(t), 2, transposed)
    assert packed.dtype == np.uint32 and packed.size == _lowp.packed_words(int(t), 61, 77)
    assert np.array_equal(packed, _lowp.lowp_pack(w, int(t), 3, transposed))
    plain = _gemm(t, w, x, 2, kernel=kernel, transposed=transposed)
    out = np.empty_like(plain)
    _lowp.set_kernel(kernel)
    try:
        _lowp.lowp_gemm(w, int(t), x, out, 3, transposed, packed)
    finally:
        _lowp.set_kernel(None)
    np.testing.assert_array_equal(out.view(np.uint32), plain.view(np.uint32))
    with pytest.raises(ShapeError, match="packed has"):
        _lowp.lowp_gemm(w, int(t), x, out, 1, transposed, packed[:-1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_long_reduction_summed_in_passes_keeps_the_order(kernel):
    """K = 2600 (1300 pair steps): the reduction runs in passes over C and blocks; every output
    is still one running sum in the kernel's order, for any thread count."""
    w, x = _bits(BF16, _f32(50, 2600, seed=11)), _f32(9, 2600, seed=12)
    want = _ordered(BF16, w, x)
    for n in (1, 2, 3):
        np.testing.assert_array_equal(_gemm(BF16, w, x, n, kernel=kernel).view(np.uint32),
                                      want.view(np.uint32))
    wt = np.ascontiguousarray(w.T)
    np.testing.assert_array_equal(_gemm(BF16, wt, x, 2, kernel=kernel, transposed=True),
                                  want)


def test_the_hash_follows_the_bits_and_not_the_thread_count():
    w = _bits(BF16, _f32(70, 33, seed=13))
    h = _lowp.lowp_hash(w, 1)
    assert h == _lowp.lowp_hash(w, 2) == _lowp.lowp_hash(w, 3) == _lowp.lowp_hash(w.copy(), 2)
    for i, j in [(0, 0), (69, 32), (35, 17)]:
        v = w.copy()
        v[i, j] ^= 1
        assert _lowp.lowp_hash(v, 2) != h
    assert _lowp.lowp_hash(w[:, :32], 2) != h and _lowp.lowp_hash(w.T, 2) != h
    strided = np.ascontiguousarray(w[:, ::2])
    assert _lowp.lowp_hash(w[:, ::2], 1) == _lowp.lowp_hash(strided, 3)


def _conversion_cases() -> np.ndarray:
    """float32 bits: random, every tie and near-tie, NaN payloads (quiet and signalling, both
    signs), infinities, zeros, subnormals, values that round to infinity."""
    rng = np.random.default_rng(14)
    rand = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32)
    hi = rng.integers(0, 1 << 16, 20_000, dtype=np.uint64).astype(np.uint32) << 16
    ties = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001, hi])
    special = np.array([0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF,
                        0x7FBFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00008000,
                        0x00018000, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0, 0x80000000],
                       np.uint32)
    return np.concatenate([rand, ties, special]).view(np.float32)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_f32_to_bf16_in_c_equals_the_numpy_rule(n_threads):
    x = _conversion_cases()
    got = np.empty(x.size, np.uint16)
    _lowp.f32_to_bf16(x, got, n_threads)
    np.testing.assert_array_equal(got, bf16_from_f32(x))
    back = np.empty(x.size, np.float32)
    _lowp.bf16_to_f32(got, back, n_threads)
    np.testing.assert_array_equal(back.view(np.uint32), f32_from_bf16(got).view(np.uint32))
    with pytest.raises(ShapeError, match="values"):
        _lowp.f32_to_bf16(x, got[:-1], n_threads)
    with pytest.raises(ShapeError, match="values"):
        _lowp.bf16_to_f32(got, back[:-1], n_threads)
