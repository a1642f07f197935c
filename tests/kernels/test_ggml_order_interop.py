"""ggml's float order (``_kernels/_ggml_order``) against the functions of the ``libggml-cpu``
that llama-cpp-python ships (built for this CPU), bit for bit: ``ggml_vec_dot_f32`` for every
length mod 32, ``ggml_vec_soft_max_f32``, ``ggml_vec_swiglu_f32`` and the quantized
``ggml_vec_dot_*`` of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; the K-quant products (Q2_K ... Q6_K)
against ggml's own ``mul_mat`` (its graph API), which takes vec_dot below 8 activation rows and
its tiled matmul from 8 on. The rules are those of an x86 build with
AVX2 and FMA (docs/ggml-order.md): on another build the test is skipped. Marker ``interop``,
skipped unless ``GGOPT_INTEROP=1``:
``GGOPT_INTEROP=1 python -m pytest -m interop tests/kernels/test_ggml_order_interop.py``."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from ggopt import quants
from ggopt._kernels import _ggml_order as go
from ggopt.types import GGType
from tests.support.ggml_lib import GGML, GgmlGraphs, ggml_q8, load_ggml, ptr
from tests.support.ggml_order import mm_f32, softmax
from tools.kquants import K_TYPES, SCALE_AT, k_blocks

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
    pytest.mark.skipif(not go.vector(), reason="ggml's AVX2+FMA build needs such a CPU"),
]

f32 = np.float32



@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    return load_ggml()


def _bits(a) -> np.ndarray:
    return np.asarray(a, f32).view(np.int32)


@pytest.mark.parametrize("path", ["vector", "portable"])
def test_f32_dot_is_ggml_vec_dot_f32(ggml, path):
    rng = np.random.default_rng(0)
    ggml.ggml_vec_dot_f32.restype = None
    go.force_portable(path == "portable")
    try:
        for k in [*range(1, 70), 100, 128, 256, 1000, 1023]:
            x = (rng.standard_normal((4, k)) * rng.uniform(0.01, 100, (4, 1))).astype(f32)
            y = rng.standard_normal((1, k)).astype(f32)
            ours = np.empty((1, 4), f32)
            mm_f32(x, y, ours, False, 1)
            for i in range(4):
                s = ctypes.c_float()
                ggml.ggml_vec_dot_f32(ctypes.c_int(k), ctypes.byref(s), ctypes.c_size_t(0),
                                      ptr(np.ascontiguousarray(x[i])), ctypes.c_size_t(0),
                                      ptr(y[0]), ctypes.c_size_t(0), ctypes.c_int(1))
                assert _bits(ours[0, i]) == _bits(s.value), (k, i)
    finally:
        go.force_portable(False)


def test_softmax_and_swiglu_are_ggml_s(ggml):
    rng = np.random.default_rng(1)
    ggml.ggml_vec_soft_max_f32.restype = ctypes.c_double
    ggml.ggml_vec_swiglu_f32.restype = None
    for n in [1, 5, 8, 13, 64, 129, 256, 1536]:
        x = (rng.standard_normal(n) * 10).astype(f32)
        x[rng.random(n) < 0.2] = -np.inf
        x[0] = 1.0
        y = np.empty(n, f32)
        total = ggml.ggml_vec_soft_max_f32(ctypes.c_int(n), ptr(y), ptr(x),
                                           ctypes.c_float(x.max()))
        ours = np.empty((1, n), f32)
        softmax(x[None], None, ours, 1.0, 1)
        np.testing.assert_array_equal(_bits(ours[0]), _bits(y * f32(1.0 / total)))
        g = rng.standard_normal(n).astype(f32)
        a = (rng.standard_normal(n) * 8).astype(f32)
        ggml.ggml_vec_swiglu_f32(ctypes.c_int(n), ptr(y), ptr(a), ptr(g))
        go.swiglu_rows(a[None], g[None], ours, 1)
        np.testing.assert_array_equal(_bits(ours[0]), _bits(y))


@pytest.mark.parametrize("qtype", [GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1,
                                   GGType.Q8_0], ids=lambda t: t.name)
def test_quantized_products_are_ggml_vec_dot(ggml, qtype):
    k, m, n = 768, 40, 11
    rng = np.random.default_rng(int(qtype))
    raw = quants.quantize((rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1)))
                          .astype(f32), qtype)
    x = (rng.standard_normal((n, k)) * np.linspace(0.1, 20, k)).astype(f32)
    ours = np.empty((n, m), f32)
    go.mul_mat_quant(raw, int(qtype), x, ours, 2)
    dot = getattr(ggml, GGML[qtype][3])
    for i in range(n):
        y = ggml_q8(ggml, qtype, x[i])
        for j in range(m):
            s = ctypes.c_float()
            dot(ctypes.c_int(k), ctypes.byref(s), ctypes.c_size_t(0),
                ptr(np.ascontiguousarray(raw[j])), ctypes.c_size_t(0), ptr(y),
                ctypes.c_size_t(0), ctypes.c_int(1))
            assert _bits(ours[i, j]) == _bits(s.value), (i, j)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_products_are_ggml_s_mul_mat(ggml, path, qtype):
    graphs = GgmlGraphs(ggml)
    rng = np.random.default_rng(int(qtype))
    raw = k_blocks(qtype, 72, 1536, seed=int(qtype), scale=4e-3)
    for n in (1, 2, 7, 8, 9, 15, 33):  # vec_dot, then tiled (tails of 1 and 7 rows)
        x = (rng.standard_normal((n, 1536)) * rng.uniform(0.05, 20, (n, 1))).astype(f32)
        ours = np.empty((n, 72), f32)
        go.mul_mat_quant(raw, int(qtype), x, ours, 2)
        np.testing.assert_array_equal(_bits(ours), _bits(graphs.mul_mat(qtype, raw, x)),
                                      err_msg=f"{n} rows")


def _same_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, or NaN on both sides (a NaN's sign and payload are not promised)."""
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(_bits(a)[~nan], _bits(b)[~nan])


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_products_of_extreme_scales_and_activations_are_ggml_s(ggml, qtype):
    """F16 scales at the edges (subnormal, largest, infinite, NaN, zero) and activation rows of
    zeros, NaN, infinities, the largest floats and subnormals: the same numbers as ggml on both
    paths and any thread count, for vec_dot's row counts and tiled's."""
    graphs = GgmlGraphs(ggml)
    rng = np.random.default_rng(int(qtype) + 100)
    special = np.array([0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x8001, 0x0000,
                        0xFBFF, 0x3C00], np.uint16)
    raw = k_blocks(qtype, 22, 512, seed=7).reshape(22, 2, -1)
    for r in range(11):  # one row per special scale (each F16 scale of its blocks)
        for at in SCALE_AT[qtype]:
            raw[r, :, at:at + 2] = special[r:r + 1].view(np.uint8)
    raw = raw.reshape(22, -1)
    for n in (3, 12):
        x = (rng.standard_normal((n, 512)) * 4).astype(f32)
        x[0] = 0.0
        x[1, 5] = np.nan
        x[2, 300] = np.inf
        if n > 3:
            x[3, :7] = -np.inf
            x[4] = 3e38
            x[5] *= 1e-40
        want = graphs.mul_mat(qtype, raw, x)
        for portable in (False, True):
            go.force_portable(portable)
            try:
                for nt in (1, 3):
                    ours = np.empty((n, 22), f32)
                    go.mul_mat_quant(raw, int(qtype), x, ours, nt)
                    assert _same_or_both_nan(ours, want), (n, portable, nt)
            finally:
                go.force_portable(False)
