"""K-quant products in ggml's float order (``_kernels/_ggml_order_k.h``) against a NumPy model
of llama.cpp's x86 AVX2+FMA build, bit for bit: below 8 activation rows its vec_dot's 8 lanes
per super-block (Q6_K's lanes corrected by bsum pairs, Q2_K's minimums fused into the lanes,
Q4_K's into 4 more, Q5_K's into one sum), from 8 rows on its tiled matmul's one sum per
output. The AVX2 version and the lane-by-lane one, on 1, 2 and 3 threads: the same bits.
(The same products against ggml's own mul_mat: test_ggml_order_interop.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _ggml_order as go
from ggopt._kernels import _quant_dot
from ggopt.errors import InvalidValueError, ShapeError
from ggopt.types import GGType
from tests.support.ggml_order import fma, hsum8
from tools.kquants import K_TYPES, k_blocks

f32 = np.float32
E = np.arange(256)


def _f16(b: np.ndarray, at: int) -> np.float32:
    return np.ascontiguousarray(b[at:at + 2]).view(np.float16)[0].astype(f32)


def _q4k_scales(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = q.astype(np.int64)
    sc = [q[j] & 63 if j < 4 else (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4) for j in range(8)]
    mn = [q[j + 4] & 63 if j < 4 else (q[j + 4] >> 4) | ((q[j] >> 6) << 4) for j in range(8)]
    return np.repeat(np.array(sc), 2), np.array(mn)


def decode(b: np.ndarray, t: GGType):
    """One super-block: (the values ggml multiplies: Q6_K its unsigned codes, the others their
    signed values; the scale of each 16 elements; the minimums or None; d; dmin)."""
    raw, b = b, b.astype(np.int64)
    if t in (GGType.Q2_K, GGType.Q3_K):
        qs = b[16:80] if t == GGType.Q2_K else b[32:96]
        c2 = (qs[32 * (E >> 7) + (E & 31)] >> (2 * ((E >> 5) & 3))) & 3
        if t == GGType.Q2_K:
            return c2, b[:16] & 15, b[:16] >> 4, _f16(raw, 80), _f16(raw, 82)
        hbit = (b[E & 31] >> (E >> 5)) & 1
        q = b[96:108]
        sc = np.array([((q[j & 7] >> (0 if j < 8 else 4)) & 15)
                       | (((q[8 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4) for j in range(16)])
        return c2 - 4 * (1 - hbit), sc - 32, None, _f16(raw, 108), f32(0)
    if t in (GGType.Q4_K, GGType.Q5_K):
        sc, mn = _q4k_scales(b[4:16])
        qs = b[16:144] if t == GGType.Q4_K else b[48:176]
        byte = qs[32 * (E >> 6) + (E & 31)]
        c = np.where((E & 63) < 32, byte & 15, byte >> 4)
        if t == GGType.Q5_K:
            c = c + 16 * ((b[16 + (E & 31)] >> (E >> 5)) & 1)
        return c, sc, mn, _f16(raw, 0), _f16(raw, 2)
    qq = (E & 127) >> 5
    lo = (b[64 * (E >> 7) + (qq & 1) * 32 + (E & 31)] >> (4 * (qq >> 1))) & 15
    hi = (b[128 + 32 * (E >> 7) + (E & 31)] >> (2 * qq)) & 3
    return lo | (hi << 4), b[192:208].astype(np.int8).astype(np.int64), None, _f16(raw, 208), f32(0)


def _lanes(t, c, sc, y, bs) -> np.ndarray:
    p = sc[E >> 4] * c * y
    lanes = np.array([p[(E & 31) // 4 == lane].sum() for lane in range(8)])
    if t == GGType.Q6_K:
        lanes = lanes - 32 * (sc[0::2] * bs[0::2] + sc[1::2] * bs[1::2])
    return lanes


def kdot_model(raw: np.ndarray, t: GGType, x: np.ndarray) -> np.ndarray:
    n, k = x.shape
    nb = k // 256
    q = np.empty((n, k), np.int8)
    dy = np.empty((n, nb), f32)
    bsum = np.empty((n, k // 16), np.int32)
    _quant_dot.quantize_activations(x, int(t), q, dy, np.empty((n, k // 32), f32), bsum, 1)
    q, bsum = q.astype(np.int64), bsum.astype(np.int64)
    out = np.empty((n, raw.shape[0]), f32)
    for r in range(raw.shape[0]):
        blocks = [decode(blk, t) for blk in raw[r].reshape(nb, -1)]
        for j in range(n):
            acc, am, summs = (f32(0) if n >= 8 else np.zeros(8, f32)), np.zeros(4, f32), f32(0)
            for i, (c, sc, mn, d, dmin) in enumerate(blocks):
                y, bs = q[j, 256 * i:256 * (i + 1)], bsum[j, 16 * i:16 * (i + 1)]
                lanes = _lanes(t, c, sc, y, bs)
                b32 = bs[0::2] + bs[1::2]
                if n >= 8:  # tiled: one rounding of each sum, then one fma per block
                    rr = f32(d * f32(lanes.sum()))
                    if mn is not None:
                        s2 = (mn * (bs if t == GGType.Q2_K else b32)).sum()
                        rr = fma(-dmin, f32(s2), rr)
                    acc = fma(rr, dy[j, i], acc)
                    continue
                dd, dm = f32(dy[j, i] * d), -f32(dy[j, i] * dmin)
                if t == GGType.Q2_K:
                    acc = fma(dm, (mn[0::2] * bs[0::2] + mn[1::2] * bs[1::2]).astype(f32), acc)
                acc = fma(dd, lanes.astype(f32), acc)
                if t in (GGType.Q4_K, GGType.Q5_K):
                    m4 = mn[0::2] * b32[0::2] + mn[1::2] * b32[1::2]
                    if t == GGType.Q4_K:
                        am = fma(dm, m4.astype(f32), am)
                    else:
                        summs = fma(dm, f32(m4.sum()), summs)
            if n >= 8:
                out[j, r] = acc
                continue
            s = hsum8(acc)
            if t == GGType.Q4_K:
                s = f32(s + f32(f32(am[0] + am[2]) + f32(am[1] + am[3])))
            if t == GGType.Q5_K:
                s = f32(s + summs)
            out[j, r] = s
    return out


def _x(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * rng.uniform(0.05, 20, (n, 1))).astype(f32)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 7, 8, 11])  # vec_dot's order below 8 rows, tiled's from 8
def test_k_products_are_their_model(path, qtype, n):
    raw = k_blocks(qtype, 13, 512, seed=n, scale=5e-3)
    x = _x(n, 512, int(qtype) + n)
    out = np.empty((n, 13), f32)
    go.mul_mat_quant(raw, int(qtype), x, out, 2)
    want = kdot_model(raw, qtype, x)
    np.testing.assert_array_equal(out.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_products_do_not_depend_on_threads_path_or_output_stride(qtype):
    raw = k_blocks(qtype, 37, 768, seed=5)
    for n in (2, 9):
        x = _x(n, 768, n)
        outs = []
        try:
            for portable in (False, True):
                go.force_portable(portable)
                for nt in (1, 2, 3):
                    wide = np.full((n, 40), 7.0, f32)
                    go.mul_mat_quant(raw, int(qtype), x, wide[:, :37], nt)
                    assert np.all(wide[:, 37:] == 7.0)  # nothing past the output's rows
                    outs.append(wide[:, :37].copy())
        finally:
            go.force_portable(False)
        assert all(np.array_equal(outs[0].view(np.int32), o.view(np.int32)) for o in outs)


def test_k_products_check_whole_super_blocks_before_writing():
    x = np.ones((2, 256), f32)
    out = np.full((2, 3), 7.0, f32)
    with pytest.raises(ShapeError, match="not 256 elements"):
        go.mul_mat_quant(np.zeros((3, 143), np.uint8), int(GGType.Q4_K), x, out, 1)
    with pytest.raises(ShapeError, match="not 96 elements"):
        go.mul_mat_quant(np.zeros((3, 210), np.uint8), int(GGType.Q6_K), x[:, :96], out, 1)
    with pytest.raises(ShapeError, match="out"):
        go.mul_mat_quant(np.zeros((4, 210), np.uint8), int(GGType.Q6_K), x, out, 1)
    assert np.all(out == 7.0)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_tiled_order_on_the_packed_kernel_is_the_model(qtype):
    """From 8 rows on, AVX2 takes the tiled order's integers from ``_quant_dot``'s packed
    kernel (panels of 32 weight rows, 4 activation rows a step): ragged panels and row groups
    give the model's bits, and so does the lane-by-lane code that runs when that kernel is
    forced portable."""
    if not (go.vector() and _quant_dot.has_ggml_tiled(int(qtype))):
        pytest.skip("the CPU has no AVX2")
    raw = k_blocks(qtype, 70, 512, seed=int(qtype), scale=5e-3)
    x = _x(37, 512, 3)
    want = kdot_model(raw, qtype, x)
    outs = []
    for kern in ("auto", "portable"):
        _quant_dot.set_kernel(kern)
        try:
            for nt in (1, 3):
                out = np.empty((37, 70), f32)
                go.mul_mat_quant(raw, int(qtype), x, out, nt)
                outs.append(out)
        finally:
            _quant_dot.set_kernel("auto")
    for out in outs:
        np.testing.assert_array_equal(out.view(np.int32), want.view(np.int32))


def test_tiled_order_is_refused_where_the_packed_kernel_lacks_it():
    x = np.ones((8, 256), f32)
    out = np.full((8, 2), 7.0, f32)
    with pytest.raises(InvalidValueError, match="tiled order"):
        _quant_dot.mul_mat_q8(np.zeros((2, 18), np.uint8), int(GGType.Q4_0), x, out, 1,
                              ggml_tiled=True)
    assert not _quant_dot.has_ggml_tiled(int(GGType.Q8_0))
    _quant_dot.set_kernel("portable")
    try:
        assert not _quant_dot.has_ggml_tiled(int(GGType.Q4_K))
        with pytest.raises(InvalidValueError, match="tiled order"):
            _quant_dot.mul_mat_q8(k_blocks(GGType.Q4_K, 2, 256), int(GGType.Q4_K), x, out, 1,
                                  ggml_tiled=True)
    finally:
        _quant_dot.set_kernel("auto")
    assert np.all(out == 7.0)


def test_tiled_order_takes_the_packed_kernel_from_8_rows_on(monkeypatch):
    """The routing itself: on AVX2 a product of 8 rows or more runs ``mul_mat_q8`` with
    ``ggml_tiled=True`` (once, for the whole slice); 7 rows, or the ggml-order kernels forced
    lane by lane, never call it."""
    if not (go.vector() and _quant_dot.has_ggml_tiled(int(GGType.Q4_K))):
        pytest.skip("the CPU has no AVX2")
    calls = []
    real = _quant_dot.mul_mat_q8

    def spy(*args, **kwargs):
        calls.append((args[3].shape, kwargs.get("ggml_tiled")))
        return real(*args, **kwargs)

    monkeypatch.setattr(_quant_dot, "mul_mat_q8", spy)
    raw = k_blocks(GGType.Q4_K, 5, 256)
    for n in (7, 8):
        go.mul_mat_quant(raw, int(GGType.Q4_K), _x(n, 256, n), np.empty((n, 5), f32), 2)
    go.force_portable(True)
    try:
        go.mul_mat_quant(raw, int(GGType.Q4_K), _x(9, 256, 9), np.empty((9, 5), f32), 2)
    finally:
        go.force_portable(False)
    assert calls == [((8, 5), True)]
