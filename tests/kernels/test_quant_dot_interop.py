"""ggopt's activation rounding and integer products against ggml's own x86 code in the
``libggml-cpu`` that llama-cpp-python ships (built for this CPU): ``quantize_row_q8_0``,
``quantize_row_q8_1`` and ``quantize_row_q8_K`` bit for bit (ties, zeros, huge values, NaN and
infinities), and ``ggml_vec_dot_*`` to float rounding (ggml adds its lanes in another order).
Marker ``interop``, skipped unless ``GGOPT_INTEROP=1``:
``GGOPT_INTEROP=1 python -m pytest -m interop tests/kernels/test_quant_dot_interop.py``."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from ggopt import quants
from ggopt._kernels import _quant_dot
from ggopt.types import GGType
from tests.support.ggml_lib import GGML, ggml_q8, load_ggml, ptr
from tools.kquants import k_blocks

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    return load_ggml()


def _rows(qb: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    n = 4 * qb
    bad = rng.standard_normal(n)
    bad[[3, qb + 5, 2 * qb + 9]] = np.nan
    bad[[7, 2 * qb + 1]] = np.inf
    bad[qb + 2] = -np.inf
    rows = [rng.standard_normal(n) * 3, (np.arange(n) - n / 2) * (127 / (n / 2)),
            rng.integers(-127, 128, n) + 0.5, np.zeros(n), np.full(n, 2.5),
            np.full(n, -1e30), rng.standard_normal(n) * 1e38, bad]
    with np.errstate(over="ignore"):
        return [np.ascontiguousarray(r, dtype=np.float32) for r in rows]


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[:, 0].astype(np.float32)


@pytest.mark.parametrize("qtype", [GGType.Q8_0, GGType.Q4_1, GGType.Q4_K],
                         ids=lambda t: t.name)
def test_activation_rounding_is_ggml_x86_bit_for_bit(ggml, qtype):
    _, size, qb, _ = GGML[qtype]
    for x in _rows(qb):
        g = ggml_q8(ggml, qtype, x)
        k = x.size
        q, d = np.empty((1, k), np.int8), np.empty((1, k // qb), np.float32)
        s, sums = np.empty((1, k // 32), np.float32), np.empty((1, k // 16), np.int32)
        _quant_dot.quantize_activations(x[None], int(qtype), q, d, s, sums, 1)
        codes = q.view(np.uint8).astype(np.int32) - 128 if qtype == GGType.Q8_0 else q
        if qb == 256:  # block_q8_K: F32 d | int8 qs[256] | int16 bsums[16]
            np.testing.assert_array_equal(g[:, 4:260].view(np.int8).ravel(), codes.ravel())
            np.testing.assert_array_equal(np.ascontiguousarray(g[:, :4]).view(np.float32)[:, 0],
                                          d[0])
            live = np.repeat(d[0] != 0, 16)  # ggml leaves an all-zero block's bsums unset
            np.testing.assert_array_equal(np.ascontiguousarray(g[:, 260:]).view(np.int16)
                                          .ravel()[live], sums.ravel()[live])
            continue
        np.testing.assert_array_equal(g[:, size - 32:].view(np.int8).ravel(), codes.ravel())
        np.testing.assert_array_equal(_f16(g[:, 0:2]), d[0])
        if qtype == GGType.Q4_1:  # block_q8_1: F16 d | F16 s | int8 qs[32]
            np.testing.assert_array_equal(_f16(g[:, 2:4]), s[0])


@pytest.mark.parametrize("qtype", list(GGML), ids=lambda t: t.name)
def test_products_are_ggml_vec_dot_to_float_rounding(ggml, qtype):
    k, m, n = 768, 40, 5
    rng = np.random.default_rng(int(qtype))
    raw = (quants.quantize(rng.standard_normal((m, k)).astype(np.float32), qtype)
           if qtype.can_quantize else k_blocks(qtype, m, k, seed=2))
    x = (rng.standard_normal((n, k)) * np.linspace(0.1, 20, k)).astype(np.float32)
    ours = np.empty((n, m), np.float32)
    _quant_dot.mul_mat_q8(raw, int(qtype), x, ours, 2)
    theirs = np.empty((n, m), np.float32)
    dot = getattr(ggml, GGML[qtype][3])
    for i in range(n):
        y = ggml_q8(ggml, qtype, x[i])
        for j in range(m):
            s, row = ctypes.c_float(), np.ascontiguousarray(raw[j])
            dot(ctypes.c_int(k), ctypes.byref(s), ctypes.c_size_t(0), ptr(row),
                ctypes.c_size_t(0), ptr(y), ctypes.c_size_t(0), ctypes.c_int(1))
            theirs[i, j] = s.value
    f32 = x @ quants.dequantize(raw, qtype).T
    err, rounding = np.abs(ours - theirs).max(), np.abs(f32 - theirs).max()
    print(f"\n{qtype.name}: |ggopt - ggml| {err:.3g}, |F32 activations - ggml| {rounding:.3g}")
    assert err <= 1e-5 * np.abs(theirs).max() and err < 0.01 * rounding
