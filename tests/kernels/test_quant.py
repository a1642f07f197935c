"""The quantized-block kernels (``_kernels/_quant.pyx``) against NumPy references built on
``gguf.quants`` (the gguf package's port of ggml's reference C): quantize bit for bit,
dequantize, get_rows, and the products on odd shapes and strided views, on 1 and 2 threads with
identical bits."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

from ggopt import quants
from ggopt._kernels import _quant
from ggopt.backend.cpu.blas import SerialBlas, products_blas
from ggopt.errors import DTypeError, ShapeError
from ggopt.types import GGType

TYPES = [GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1, GGType.Q8_0]


def _values(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Rows of mixed scales, with the blocks that stress the quantizers: all zero, constant,
    one outlier, ties of the largest magnitude of opposite signs, tiny (subnormal F16 scale)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * rng.uniform(1e-3, 30.0, (rows, 1))
    x = x.astype(np.float32)
    if rows >= 5 and cols >= 32:
        x[0, :32] = 0.0
        x[1, :32] = 2.5
        x[2, :32] = 0.01
        x[2, 7] = -40.0
        x[3, :32] = 1.0
        x[3, 3], x[3, 9] = -3.0, 3.0
        x[4, :32] *= 1e-6
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(autouse=True, scope="module")
def _one_thread_blas():
    products_blas()
    with SerialBlas():
        yield


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_quantize_is_ggml_reference_bit_for_bit(qtype, n_threads):
    x = _values(37, 160)
    ref = gq.quantize(x, GQT(int(qtype)))
    got = quants.quantize(x, qtype, n_threads=n_threads)
    assert got.shape == ref.shape == (37, 160 // 32 * qtype.size)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_and_is_thread_independent(qtype):
    raw = gq.quantize(_values(41, 96, seed=1), GQT(int(qtype)))
    ref = gq.dequantize(raw, GQT(int(qtype)))
    one = quants.dequantize(raw, qtype, n_threads=1)
    two = quants.dequantize(raw, qtype, n_threads=2)
    np.testing.assert_array_equal(_bits(one), _bits(ref))
    np.testing.assert_array_equal(_bits(one), _bits(two))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_strided_rows_of_a_4d_view(qtype):
    raw = gq.quantize(_values(2 * 3 * 10, 64, seed=2), GQT(int(qtype))).reshape(2, 3, 10, -1)
    view = raw[:, ::2, 1::3]  # rows picked with strides, each row still whole
    out = np.empty(view.shape[:3] + (64,), np.float32)
    _quant.dequantize_rows(view, int(qtype), out, 2)
    ref = gq.dequantize(np.ascontiguousarray(view), GQT(int(qtype)))
    np.testing.assert_array_equal(_bits(out), _bits(ref))


@pytest.mark.parametrize("qtype", [GGType.Q5_0, GGType.Q5_1], ids=lambda t: t.name)
def test_avx2_dequantization_gives_the_portable_values(qtype):
    """Q5_0 / Q5_1 blocks dequantized with AVX2 (the default where the CPU has it) and with
    the portable C (``set_vectorized(False)``): the same bits, on random bytes as blocks (every
    code and fifth-bit pattern, NaN and infinite F16 scales) and on quantized values, through
    dequantize_rows and the gradient product's dequantized panels."""
    if not _quant.set_vectorized(True):
        pytest.skip("no AVX2 on this CPU")
    bb = 22 if qtype == GGType.Q5_0 else 24
    rng = np.random.default_rng(6)
    noise = rng.integers(0, 256, (37, 5 * bb), dtype=np.uint8)
    fair = gq.quantize(_values(37, 160, seed=3), GQT(int(qtype)))
    g = rng.standard_normal((9, 37)).astype(np.float32)
    got = {}
    try:
        for vec in (True, False):
            assert _quant.set_vectorized(vec) == vec
            for name, raw in (("noise", noise), ("fair", fair)):
                out = np.empty((1, 1, 37, 160), np.float32)
                _quant.dequantize_rows(raw[None, None], int(qtype), out, 2)
                got[vec, name] = out
            prod = np.empty((9, 160), np.float32)
            _quant.out_prod_quantized(fair, int(qtype), g, prod, 2)
            got[vec, "product"] = prod
    finally:
        _quant.set_vectorized(True)
    for name in ("noise", "fair", "product"):
        np.testing.assert_array_equal(_bits(got[True, name]), _bits(got[False, name]),
                                      err_msg=name)
    assert np.isnan(got[True, "noise"]).any()  # the random scales include NaN


def test_f16_scale_conversion_is_round_to_nearest_even_everywhere():
    halves = np.arange(1 << 16, dtype=np.uint16)
    finite = halves[~np.isnan(halves.view(np.float16))]
    got = np.array([_quant._f16_value(int(h)) for h in finite], np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(finite.view(np.float16).astype(np.float32)))
    rng = np.random.default_rng(3)
    probes = np.concatenate([
        rng.standard_normal(4000) * 10.0 ** rng.uniform(-9, 5, 4000),
        [65504.0, 65519.99, 65520.0, 1e9, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-14,
         6.1e-5, 0.0, -0.0, np.inf, -np.inf]]).astype(np.float32)
    got_bits = np.array([_quant._f16_bits(float(v)) for v in probes], np.uint16)
    with np.errstate(over="ignore"):  # 1e9 and inf: the cast overflows to inf, as wanted
        want = probes.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got_bits, want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 32, 1), (5, 96, 3), (130, 160, 7), (64, 64, 1)])
def test_mul_mat_is_the_dequantized_product(qtype, shape):
    M, K, N = shape
    raw = gq.quantize(_values(M, K, seed=4), GQT(int(qtype)))
    w = gq.dequantize(raw, GQT(int(qtype)))
    x = _values(N, K, seed=5)
    outs = []
    for n in (1, 2):
        out = np.full((N, M), 7.0, np.float32)
        _quant.mul_mat_quantized(raw, int(qtype), x, out, n)
        outs.append(out)
    np.testing.assert_allclose(outs[0], x.astype(np.float64) @ w.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4 * float(np.abs(x).max() * np.abs(w).max()))
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 32, 1), (7, 96, 3), (70, 288, 5), (9000, 160, 3),
                                   (8200, 320, 2)])
def test_out_prod_is_g_times_the_dequantized_weight(qtype, shape):
    # over 4096 rows (an output head) the sums are chunked: 3 chunks, 1 or 2 wide panels,
    # computed as many chunks at a time as the threads need (1, 2 or 3: a last group of 1)
    M, K, N = shape
    raw = gq.quantize(_values(M, K, seed=6), GQT(int(qtype)))
    w = gq.dequantize(raw, GQT(int(qtype)))
    g = _values(N, M, seed=7)
    outs = []
    for n in (1, 2, 3, 5):
        out = np.full((N, K), 7.0, np.float32)
        _quant.out_prod_quantized(raw, int(qtype), g, out, n)
        outs.append(out)
    np.testing.assert_allclose(outs[0], g.astype(np.float64) @ w.astype(np.float64),
                               rtol=1e-4, atol=1e-4 * float(np.abs(g).max() * np.abs(w).max()))
    for out in outs[1:]:
        np.testing.assert_array_equal(_bits(outs[0]), _bits(out))


def test_products_read_padded_row_strides():
    qtype = GGType.Q4_1
    raw = gq.quantize(_values(9, 64, seed=8), GQT(int(qtype)))
    padded = np.zeros((9, raw.shape[1] + 8), np.uint8)
    padded[:, :raw.shape[1]] = raw
    x_padded = np.zeros((4, 80), np.float32)
    x_padded[:, :64] = _values(4, 64, seed=9)
    out = np.zeros((4, 16), np.float32)
    _quant.mul_mat_quantized(padded[:, :raw.shape[1]], int(qtype), x_padded[:, :64],
                             out[:, 3:12], 2)
    ref = np.empty((4, 9), np.float32)
    _quant.mul_mat_quantized(raw, int(qtype), np.ascontiguousarray(x_padded[:, :64]), ref, 1)
    np.testing.assert_array_equal(out[:, 3:12], ref)
    assert not out[:, :3].any() and not out[:, 12:].any()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_get_quantized_rows(qtype):
    raw = gq.quantize(_values(2 * 11, 64, seed=10), GQT(int(qtype))).reshape(1, 2, 11, -1)
    idx = np.array([[[3, 0, 10, 3], [1, 1, 2, 9]]], np.int32)
    out = np.empty((1, 2, 4, 64), np.float32)
    _quant.get_quantized_rows(raw, int(qtype), idx, out, 2)
    deq = gq.dequantize(raw, GQT(int(qtype)))
    for i2 in range(2):
        np.testing.assert_array_equal(_bits(out[0, i2]), _bits(deq[0, i2][idx[0, i2]]))


# ----------------------------------------------------------------------------- bad input


def test_helpers_refuse_truncated_blocks_and_partial_rows():
    raw = gq.quantize(_values(3, 64), GQT.Q8_0)
    with pytest.raises(ShapeError, match="truncated"):
        quants.dequantize(raw.reshape(-1)[:-1], GGType.Q8_0, (3, 64))
    with pytest.raises(ShapeError, match="blocks"):
        quants.dequantize(raw[:, :-1], GGType.Q8_0)
    with pytest.raises(ShapeError, match="whole number"):
        quants.quantize(_values(3, 48), GGType.Q4_0)
    with pytest.raises(DTypeError, match="float32"):
        quants.quantize(_values(3, 64).astype(np.float64), GGType.Q4_0)
    with pytest.raises(DTypeError, match="not a quantized type"):
        quants.quantize(_values(3, 64), GGType.F32)


def test_kernels_refuse_bad_rows_types_and_indices():
    raw = gq.quantize(_values(4, 64), GQT.Q4_0)
    out = np.full((4, 64), 7.0, np.float32)
    before = out.copy()
    with pytest.raises(ShapeError, match="bytes"):  # a Q4_0 row read as Q8_0
        _quant.dequantize_rows(raw[None, None], int(GGType.Q8_0), out[None, None], 1)
    with pytest.raises(DTypeError, match="not a quantized type"):
        _quant.dequantize_rows(raw[None, None], 0, out[None, None], 1)
    with pytest.raises(ShapeError, match="whole"):
        _quant.quantize_rows(out[None, None, :, :48].copy(), int(GGType.Q4_0),
                             raw[None, None], 1)
    rows = np.full((1, 1, 2, 64), 7.0, np.float32)
    with pytest.raises(ShapeError, match=r"idx\[0, 0, 1\] = 4"):
        _quant.get_quantized_rows(raw[None, None], int(GGType.Q4_0),
                                  np.array([[[0, 4]]], np.int32), rows, 2)
    with pytest.raises(ShapeError):
        _quant.mul_mat_quantized(raw, int(GGType.Q4_0), _values(3, 64), np.empty((3, 5),
                                 np.float32), 1)
    with pytest.raises(ShapeError):
        _quant.out_prod_quantized(raw, int(GGType.Q4_0), _values(3, 5), np.empty((3, 64),
                                  np.float32), 1)
    np.testing.assert_array_equal(out, before)
    assert (rows == 7.0).all()


def test_helpers_refuse_wrong_argument_kinds_with_ggopt_errors():
    """Were raw TypeError / ValueError / AttributeError tracebacks."""
    import ggopt

    raw = gq.quantize(_values(4, 64), GQT.Q8_0)
    ctx = ggopt.Context(no_alloc=True)
    bad_data = [list(raw.reshape(-1)), None, np.empty(raw.size, object)]
    for data in bad_data:
        with pytest.raises(DTypeError, match="tensor 'w': data"):
            quants.tensor_from_blocks(ctx, GGType.Q8_0, (64, 4), data, "w")
    with pytest.raises(DTypeError, match="ctx must be a ggopt.Context"):
        quants.tensor_from_blocks(None, GGType.Q8_0, (64, 4), raw, "w")  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="name must be a str"):
        quants.tensor_from_blocks(ctx, GGType.Q8_0, (64, 4), raw, 5)  # type: ignore[arg-type]
    assert not ctx.tensors
    for shape in (5, ("a",)):
        with pytest.raises(DTypeError, match="shape must be a sequence of ints"):
            quants.dequantize(raw, GGType.Q8_0, shape)  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="n_threads must be an int"):
        quants.quantize(_values(1, 32), GGType.Q8_0, n_threads="2")  # type: ignore[arg-type]
    with pytest.raises(ggopt.InvalidValueError, match="quantize: n_threads"):
        quants.quantize(_values(1, 32), GGType.Q8_0, n_threads=0)
