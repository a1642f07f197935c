"""The K-quant super-blocks (Q4_K, Q5_K, Q6_K) through the ``_kernels/_quant.pyx`` kernels against
``gguf.quants.dequantize``: dequantize bit for bit (contiguous and strided rows), get_rows,
mul_mat and out_prod on odd shapes, identical bits on 1 and 2 threads; quantizing to them is
refused."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt import quants
from ggopt._kernels import _quant
from ggopt.backend.cpu.blas import SerialBlas, products_blas
from ggopt.errors import DTypeError, ShapeError
from tools.kquants import K_TYPES, SCALE_AT, gguf_values, k_blocks

IDS = {"ids": lambda t: t.name}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _values(rows: int, cols: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


@pytest.fixture(autouse=True, scope="module")
def _one_thread_blas():
    products_blas()
    with SerialBlas():
        yield


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_dequantize_is_gguf_bit_for_bit_on_any_thread_count(qtype):
    raw = k_blocks(qtype, 29, 768, seed=1)
    ref = gguf_values(raw, qtype)
    one, two = (quants.dequantize(raw, qtype, n_threads=n) for n in (1, 2))
    assert one.shape == (29, 768)
    np.testing.assert_array_equal(_bits(one), _bits(ref))
    np.testing.assert_array_equal(_bits(two), _bits(ref))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_dequantize_any_bytes_with_finite_scales(qtype):
    """Every code, scale and minimum bit pattern: random bytes, even negative or tiny F16
    scales (only NaN / infinite ones are left out)."""
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, (64, qtype.size), dtype=np.uint8)
    for at in SCALE_AT[qtype]:
        raw[:, at + 1] &= 0xFB  # exponent below 31: a finite F16
    np.testing.assert_array_equal(_bits(quants.dequantize(raw, qtype, n_threads=2)),
                                  _bits(gguf_values(raw, qtype)))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_dequantize_strided_rows_of_a_4d_view(qtype):
    raw = k_blocks(qtype, 2 * 3 * 10, 256, seed=3).reshape(2, 3, 10, -1)
    view = raw[:, ::2, 1::3]
    out = np.empty(view.shape[:3] + (256,), np.float32)
    _quant.dequantize_rows(view, int(qtype), out, 2)
    np.testing.assert_array_equal(_bits(out), _bits(gguf_values(np.ascontiguousarray(view),
                                                                 qtype)))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_get_quantized_rows(qtype):
    raw = k_blocks(qtype, 2 * 11, 512, seed=4).reshape(1, 2, 11, -1)
    idx = np.array([[[3, 0, 10, 3], [1, 1, 2, 9]]], np.int32)
    out = np.empty((1, 2, 4, 512), np.float32)
    _quant.get_quantized_rows(raw, int(qtype), idx, out, 2)
    deq = gguf_values(raw, qtype)
    for i2 in range(2):
        np.testing.assert_array_equal(_bits(out[0, i2]), _bits(deq[0, i2][idx[0, i2]]))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
@pytest.mark.parametrize("shape", [(1, 256, 1), (5, 512, 3), (130, 768, 7)])
def test_mul_mat_is_the_dequantized_product(qtype, shape):
    M, K, N = shape
    raw = k_blocks(qtype, M, K, seed=5)
    w = gguf_values(raw, qtype)
    x = _values(N, K, seed=6)
    outs = []
    for n in (1, 2):
        out = np.full((N, M), 7.0, np.float32)
        _quant.mul_mat_quantized(raw, int(qtype), x, out, n)
        outs.append(out)
    np.testing.assert_allclose(outs[0], x.astype(np.float64) @ w.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4 * float(np.abs(x).max() * np.abs(w).max()))
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
@pytest.mark.parametrize("shape", [(1, 256, 1), (7, 768, 3), (70, 1280, 5), (4100, 512, 2)])
def test_out_prod_is_g_times_the_dequantized_weight(qtype, shape):
    M, K, N = shape
    raw = k_blocks(qtype, M, K, seed=7)
    w = gguf_values(raw, qtype)
    g = _values(N, M, seed=8)
    outs = []
    for n in (1, 2):
        out = np.full((N, K), 7.0, np.float32)
        _quant.out_prod_quantized(raw, int(qtype), g, out, n)
        outs.append(out)
    np.testing.assert_allclose(outs[0], g.astype(np.float64) @ w.astype(np.float64),
                               rtol=1e-4, atol=1e-4 * float(np.abs(g).max() * np.abs(w).max()))
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_partial_super_blocks_and_quantizing_are_refused(qtype):
    raw = k_blocks(qtype, 3, 256)
    out = np.full((1, 1, 3, 256), 7.0, np.float32)
    with pytest.raises(ShapeError, match="256-element blocks"):  # 32-element rows
        _quant.dequantize_rows(raw[None, None, :, :32], int(qtype), out[..., :32].copy(), 1)
    with pytest.raises(ShapeError, match="truncated"):
        quants.dequantize(raw[:, :-1], qtype)
    with pytest.raises(ShapeError, match="whole number of 256-element"):
        quants.dequantize(raw.reshape(-1)[:qtype.size], qtype, (1, 128))
    with pytest.raises(DTypeError, match="cannot quantize"):
        _quant.quantize_rows(out, int(qtype), np.zeros((1, 1, 3, qtype.size), np.uint8), 1)
    with pytest.raises(DTypeError, match=f"{qtype.name} can be loaded.*not quantized"):
        quants.quantize(out[0, 0], qtype)
    assert (out == 7.0).all()
