"""The private Cython kernels refuse inconsistent arguments before they write anything.

Each kernel in ``ggopt/_kernels`` is called directly with one bad argument at a time (a wrong
output or input shape, an index outside the rows, a window parameter out of range, a thread
count below 1 or absurdly large, a missing array): it must raise the GgoptError subclass named
here and leave ``dst`` exactly as it was. Cases that once crashed the interpreter run in a fresh
Python process, so a regression fails one test instead of ending the test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ggopt._kernels import (
    _attention,
    _conv,
    _conv2d,
    _copy,
    _elementwise,
    _gather,
    _get_rows,
    _lowp,
    _norm,
    _optim,
    _pointwise,
    _pool,
    _quant,
    _quant_dot,
    _reduce,
    _rope,
    _softmax,
)
from ggopt.backend.cpu.threads import MAX_N_THREADS
from ggopt.errors import InvalidValueError, ShapeError

ROOT = Path(__file__).resolve().parents[2]


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def assert_refuses(error: type[Exception], dst: np.ndarray, call: Callable[[], object],
             match: str | None = None) -> None:
    """``call()`` raises ``error`` and leaves ``dst`` bit for bit unchanged."""
    before = dst.copy()
    with pytest.raises(error, match=match):
        call()
    np.testing.assert_array_equal(dst.view(np.uint8), before.view(np.uint8))


def assert_exits_normally(code: str) -> None:
    """Run ``code`` in a fresh interpreter (this checkout's ggopt); it must exit normally."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        f"exit status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert "refused" in proc.stdout


# ----------------------------------------------------------------------------- get_rows


def test_get_rows_index_past_the_end_is_refused():
    a = _f32(1, 2, 5, 3)
    dst = np.full((1, 2, 4, 3), 7.0, np.float32)
    for bad in (5, 1 << 30, -1, -(1 << 31)):
        idx = np.array([[[0, 1, 2, 3], [4, 0, bad, 1]]], np.int32)
        assert_refuses(ShapeError, dst, lambda idx=idx: _get_rows.get_rows(a, idx, dst, 1),
                 match=r"get_rows .*idx\[0, 1, 2\]")


def test_get_rows_index_past_the_end_in_a_subprocess():
    assert_exits_normally("""
        import numpy as np
        from ggopt._kernels import _get_rows
        from ggopt.errors import ShapeError
        a = np.ones((1, 1, 4, 1024), np.float32)
        dst = np.zeros((1, 1, 64, 1024), np.float32)
        idx = np.full((1, 1, 64), 2**31 - 1, np.int32)
        try:
            _get_rows.get_rows(a, idx, dst, 2)
        except ShapeError:
            assert not dst.any()
            print("refused")
    """)


def test_get_rows_shape_mismatches():
    a = _f32(2, 3, 5, 4)
    idx = np.zeros((2, 3, 6), np.int32)
    dst = np.full((2, 3, 6, 4), 7.0, np.float32)
    _get_rows.get_rows(a, idx, dst, 2)  # consistent: works
    np.testing.assert_array_equal(dst, a[:, :, :1, :].repeat(6, axis=2))
    dst[:] = 7.0
    for idx_shape in [(1, 3, 6), (2, 3, 7), (2, 2, 6)]:
        bad_idx = np.zeros(idx_shape, np.int32)
        assert_refuses(ShapeError, dst, lambda i=bad_idx: _get_rows.get_rows(a, i, dst, 1))
    for shape in [(2, 3, 6, 5), (2, 3, 5, 4), (1, 3, 6, 4)]:
        bad_dst = np.full(shape, 7.0, np.float32)
        assert_refuses(ShapeError, bad_dst, lambda d=bad_dst: _get_rows.get_rows(a, idx, d, 1))


def test_get_rows_back_rejects_bad_indices():
    g = _f32(4, 3)
    dst = np.full((5, 3), 7.0, np.float32)
    for bad in (-1, 5, 1 << 30):
        idx = np.array([0, bad, 2, 3], np.int32)
        assert_refuses(ShapeError, dst, lambda idx=idx: _get_rows.get_rows_back(g, idx, dst, 1),
                 match="get_rows_back")
    empty = np.zeros((0, 3), np.float32)
    assert_refuses(ShapeError, empty,
             lambda: _get_rows.get_rows_back(g, np.zeros(4, np.int32), empty, 1))


def test_get_rows_back_shape_mismatches():
    dst = np.full((5, 3), 7.0, np.float32)
    idx = np.array([0, 1, 2, 3], np.int32)
    assert_refuses(ShapeError, dst, lambda: _get_rows.get_rows_back(_f32(3, 3), idx, dst, 1))
    assert_refuses(ShapeError, dst, lambda: _get_rows.get_rows_back(_f32(4, 2), idx, dst, 1))
    assert_refuses(ShapeError, dst, lambda: _get_rows.get_rows_back(_f32(4, 4), idx, dst, 1))
    g = _f32(4, 3)
    _get_rows.get_rows_back(g, idx, dst, 2)  # consistent: works
    np.testing.assert_array_equal(dst[:4], g)
    np.testing.assert_array_equal(dst[4], 0)


# ----------------------------------------------------------------------------- convolution

# KH, KW, s0, s1, p0, p1, d0, d1 of a 3x3 window, stride 1, padding 1: 6x7 stays 6x7.
CFG = (3, 3, 1, 1, 1, 1, 1, 1)


def test_im2col_wrong_output_shape_in_a_subprocess():
    """A too-narrow last axis once made the kernel write past dst ('double free or
    corruption'): now every wrong dst shape is a ShapeError, and the process lives on."""
    assert_exits_normally(f"""
        import numpy as np
        from ggopt._kernels import _conv
        from ggopt.errors import ShapeError
        x = np.ones((2, 4, 6, 7), np.float32)
        for shape in [(2, 6, 7, 35), (2, 6, 7, 1), (3, 6, 7, 36), (2, 7, 7, 36), (2, 6, 9, 36)]:
            dst = np.zeros(shape, np.float32)
            try:
                _conv.im2col(x, dst, *{CFG}, 2)
            except ShapeError:
                assert not dst.any()
            else:
                raise SystemExit(f"dst {{shape}} was accepted")
        dst = np.zeros((2, 6, 7, 36), np.float32)
        _conv.im2col(x, dst, *{CFG}, 2)
        assert dst.any()
        print("refused")
    """)


def test_im2col_shape_and_parameter_errors():
    x = _f32(2, 4, 6, 7)
    dst = np.full((2, 6, 7, 36), 7.0, np.float32)
    assert_refuses(ShapeError, dst, lambda: _conv.im2col(_f32(2, 3, 6, 7), dst, *CFG, 1),
             match=r"im2col .*expected \(2, 6, 7, 27\)")
    assert_refuses(ShapeError, dst, lambda: _conv.im2col(_f32(2, 4, 5, 7), dst, *CFG, 1))
    for k in range(8):
        for value in (0, -1) if k not in (4, 5) else (-1,):
            cfg = list(CFG)
            cfg[k] = value
            assert_refuses(InvalidValueError, dst, lambda c=cfg: _conv.im2col(x, dst, *c, 1))


def test_im2col_back_shape_and_parameter_errors():
    g = _f32(2, 6, 7, 36)
    dst = np.full((2, 4, 6, 7), 7.0, np.float32)
    for shape in [(2, 6, 7, 35), (1, 6, 7, 36), (2, 5, 7, 36), (2, 6, 8, 36)]:
        assert_refuses(ShapeError, dst, lambda s=shape: _conv.im2col_back(_f32(*s), dst, *CFG, 1),
                 match="im2col_back")
    for k in range(8):
        cfg = list(CFG)
        cfg[k] = -1
        assert_refuses(InvalidValueError, dst, lambda c=cfg: _conv.im2col_back(g, dst, *c, 1))
    _conv.im2col_back(g, dst, *CFG, 2)  # consistent: works
    assert np.isfinite(dst).all()


# s0, s1, p0, p1, d0, d1 of the direct convolution: with a 3x3 kernel, 6x7 stays 6x7.
CONV2D = (1, 1, 1, 1, 1, 1)


def test_conv_2d_shape_and_parameter_errors():
    k, x = _f32(5, 4, 3, 3), _f32(2, 4, 6, 7, seed=1)
    dst = np.full((2, 5, 6, 7), 7.0, np.float32)
    for shape in [(2, 5, 6, 8), (2, 5, 5, 7), (2, 4, 6, 7), (1, 5, 6, 7)]:
        bad = np.full(shape, 7.0, np.float32)
        assert_refuses(ShapeError, bad, lambda b=bad: _conv2d.conv_2d(k, x, b, *CONV2D, 1),
                       match="conv_2d .*dst has shape")
    assert_refuses(ShapeError, dst, lambda: _conv2d.conv_2d(_f32(5, 3, 3, 3), x, dst, *CONV2D, 1),
                   match=r"k has shape \(5, 3\), expected \(5, 4\)")
    assert_refuses(ShapeError, dst, lambda: _conv2d.conv_2d(_f32(5, 4, 0, 3), x, dst, *CONV2D, 1),
                   match="at least 1x1")
    for j in range(6):
        for value in (0, -1) if j not in (2, 3) else (-1,):
            cfg = list(CONV2D)
            cfg[j] = value
            assert_refuses(InvalidValueError, dst,
                           lambda c=cfg: _conv2d.conv_2d(k, x, dst, *c, 1))
    _conv2d.conv_2d(k, x, dst, *CONV2D, 2)  # consistent: works
    assert np.isfinite(dst).all()


def test_conv_2d_gradients_shape_and_parameter_errors():
    k, x, gy = _f32(5, 4, 3, 3), _f32(2, 4, 6, 7, seed=1), _f32(2, 5, 6, 7, seed=2)
    dx = np.full((2, 4, 6, 7), 7.0, np.float32)
    dk = np.full((5, 4, 3, 3), 7.0, np.float32)
    for shape in [(2, 5, 6, 8), (1, 5, 6, 7), (2, 4, 6, 7), (2, 5, 5, 7)]:
        bad = _f32(*shape)
        assert_refuses(ShapeError, dx, lambda b=bad: _conv2d.conv_2d_back_input(
            k, b, dx, *CONV2D, 1), match="conv_2d_back_input: gy has shape")
        assert_refuses(ShapeError, dk, lambda b=bad: _conv2d.conv_2d_back_kernel(
            x, b, dk, *CONV2D, 1), match="conv_2d_back_kernel: gy has shape")
    assert_refuses(ShapeError, dx, lambda: _conv2d.conv_2d_back_input(
        _f32(5, 3, 3, 3), gy, dx, *CONV2D, 1), match="k has shape")
    assert_refuses(ShapeError, dk, lambda: _conv2d.conv_2d_back_kernel(
        _f32(2, 3, 6, 7), gy, dk, *CONV2D, 1), match="dst has shape")
    for j in range(6):
        cfg = list(CONV2D)
        cfg[j] = -1
        assert_refuses(InvalidValueError, dx,
                       lambda c=cfg: _conv2d.conv_2d_back_input(k, gy, dx, *c, 1))
        assert_refuses(InvalidValueError, dk,
                       lambda c=cfg: _conv2d.conv_2d_back_kernel(x, gy, dk, *c, 1))
    _conv2d.conv_2d_back_input(k, gy, dx, *CONV2D, 2)  # consistent: works
    _conv2d.conv_2d_back_kernel(x, gy, dk, *CONV2D, 2)
    assert np.isfinite(dx).all() and np.isfinite(dk).all()


def test_conv_2d_refuses_sizes_beyond_blas_ints():
    """OH*OW must reach BLAS as a C int: a 1 x 2**31 output is refused before any work."""
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (1, 1, 1, 2**31), (0, 0, 0, 0))
    dst = np.full((1, 1, 1, 1), 7.0, np.float32)
    assert_refuses(ShapeError, dst, lambda: _conv2d.conv_2d(_f32(1, 1, 1, 1), x, dst,
                                                            1, 1, 0, 0, 1, 1, 1),
                   match="below 2\\*\\*31")


# k0, k1, s0, s1, p0, p1 of a 2x2 window, stride 2: 6x7 pools to 3x3.
POOL = (2, 2, 2, 2, 0, 0)


def test_pool_2d_shape_and_parameter_errors():
    x = _f32(2, 3, 6, 7)
    dst = np.full((2, 3, 3, 3), 7.0, np.float32)
    for shape in [(2, 3, 3, 4), (2, 3, 4, 3), (2, 4, 3, 3), (3, 3, 3, 3)]:
        bad = np.full(shape, 7.0, np.float32)
        assert_refuses(ShapeError, bad, lambda b=bad: _pool.pool_2d(x, b, _pool.POOL_MAX, *POOL, 1),
                 match="pool_2d")
    assert_refuses(InvalidValueError, dst, lambda: _pool.pool_2d(x, dst, 2, *POOL, 1), match="op")
    assert_refuses(InvalidValueError, dst, lambda: _pool.pool_2d(x, dst, -1, *POOL, 1))
    for k in range(6):
        cfg = list(POOL)
        cfg[k] = -1
        assert_refuses(InvalidValueError, dst,
                 lambda c=cfg: _pool.pool_2d(x, dst, _pool.POOL_AVG, *c, 1))
    _pool.pool_2d(x, dst, _pool.POOL_MAX, *POOL, 2)  # consistent: works
    np.testing.assert_array_equal(dst, x[:, :, :6, :6].reshape(2, 3, 3, 2, 3, 2).max((3, 5)))


def test_pool_2d_back_shape_and_parameter_errors():
    g, x = _f32(2, 3, 3, 3), _f32(2, 3, 6, 7, seed=1)
    dst = np.full((2, 3, 6, 7), 7.0, np.float32)
    for op in (_pool.POOL_MAX, _pool.POOL_AVG):
        assert_refuses(ShapeError, dst, lambda o=op: _pool.pool_2d_back(_f32(1, 3, 3, 3), x, dst, o,
                                                                  *POOL, 1))
        assert_refuses(ShapeError, dst, lambda o=op: _pool.pool_2d_back(_f32(2, 3, 3, 4), x, dst, o,
                                                                  *POOL, 1))
        assert_refuses(ShapeError, dst, lambda o=op: _pool.pool_2d_back(g, _f32(1, 3, 6, 7), dst, o,
                                                                  *POOL, 1), match="x has shape")
        assert_refuses(ShapeError, dst, lambda o=op: _pool.pool_2d_back(g, _f32(2, 3, 4, 4), dst, o,
                                                                  *POOL, 1))
    assert_refuses(InvalidValueError, dst, lambda: _pool.pool_2d_back(g, x, dst, 7, *POOL, 1))
    for k in range(6):
        cfg = list(POOL)
        cfg[k] = -1
        assert_refuses(InvalidValueError, dst,
                 lambda c=cfg: _pool.pool_2d_back(g, x, dst, _pool.POOL_MAX, *c, 1))
    _pool.pool_2d_back(g, x, dst, _pool.POOL_AVG, *POOL, 2)  # consistent: works
    np.testing.assert_allclose(dst[:, :, :6, :6].sum(), g.sum(), rtol=1e-5)


# ----------------------------------------------------------------------------- thread counts


def _calls() -> dict[str, tuple[np.ndarray, Callable[[int], object]]]:
    """For every public kernel: an output array (or a stand-in) and a valid call taking
    n_threads."""
    w_lp, out_lp = np.full((4, 9), 0x3F80, np.uint16), np.full((5, 4), 7.0, np.float32)
    a4, b4 = _f32(2, 3, 4, 8), _f32(2, 3, 4, 8, seed=1)
    d4 = np.full((2, 3, 4, 8), 7.0, np.float32)
    rows = np.full((2, 3, 4, 1), 7.0, np.float32)
    logits, labels = _f32(4, 8), np.full((4, 8), 0.125, np.float32)
    d2 = np.full((4, 8), 7.0, np.float32)
    d1 = np.full(8, 7.0, np.float32)
    w, g1, m, v = (np.ones(8, np.float32) for _ in range(4))
    src = np.arange(64, dtype=np.uint8)
    gathered = np.zeros(16, np.uint8)
    am = np.full(4, 7, np.int32)
    ints = np.zeros((2, 3, 4, 8), np.int32)
    conv = np.full((2, 6, 7, 36), 7.0, np.float32)
    pooled = np.full((2, 3, 3, 3), 7.0, np.float32)
    img = np.full((2, 4, 6, 7), 7.0, np.float32)
    conv_out = np.full((2, 5, 6, 7), 7.0, np.float32)
    kernel = np.full((5, 4, 3, 3), 7.0, np.float32)
    pos = np.arange(3, dtype=np.int32)
    return {
        "get_rows": (d4, lambda n: _get_rows.get_rows(
            b4, np.zeros((2, 3, 4), np.int32), d4, n)),
        "get_rows_back": (d2, lambda n: _get_rows.get_rows_back(
            _f32(3, 8), np.array([0, 1, 3], np.int32), d2, n)),
        "im2col": (conv, lambda n: _conv.im2col(_f32(2, 4, 6, 7), conv, *CFG, n)),
        "im2col_back": (img, lambda n: _conv.im2col_back(_f32(2, 6, 7, 36), img, *CFG, n)),
        "pool_2d": (pooled, lambda n: _pool.pool_2d(_f32(2, 3, 6, 7), pooled, 0, *POOL, n)),
        "pool_2d_back": (img, lambda n: _pool.pool_2d_back(
            _f32(2, 4, 3, 3), _f32(2, 4, 6, 7), img, 0, *POOL, n)),
        "conv_2d": (conv_out, lambda n: _conv2d.conv_2d(_f32(5, 4, 3, 3), _f32(2, 4, 6, 7),
                                                        conv_out, *CONV2D, n)),
        "conv_2d_back_input": (img, lambda n: _conv2d.conv_2d_back_input(
            _f32(5, 4, 3, 3), _f32(2, 5, 6, 7), img, *CONV2D, n)),
        "conv_2d_back_kernel": (kernel, lambda n: _conv2d.conv_2d_back_kernel(
            _f32(2, 4, 6, 7), _f32(2, 5, 6, 7), kernel, *CONV2D, n)),
        "copy": (d4, lambda n: _copy.copy(a4, d4, n)),
        "binary": (d4, lambda n: _elementwise.binary(0, a4, b4, d4, n)),
        "unary": (d4, lambda n: _elementwise.unary(0, a4, d4, n)),
        "unary_back": (d4, lambda n: _elementwise.unary_back(0, a4, b4, d4, n)),
        "scale": (d4, lambda n: _elementwise.scale(a4, d4, 2.0, 0.0, n)),
        "gather_shards": (gathered, lambda n: _gather.gather_shards(
            src, gathered, np.arange(4, dtype=np.int64), 0, 2, 8, n)),
        "rms_norm": (d4, lambda n: _norm.rms_norm(a4, d4, 1e-5, n)),
        "rms_norm_back": (d4, lambda n: _norm.rms_norm_back(a4, b4, d4, 1e-5, n)),
        "norm": (d4, lambda n: _norm.norm(a4, d4, 1e-5, n)),
        "norm_back": (d4, lambda n: _norm.norm_back(a4, b4, d4, 1e-5, n)),
        "adamw_step": (w, lambda n: _optim.adamw_step(
            w, g1, m, v, np.array([1e-3, 0.9, 0.999, 1e-8, 0, 10, 1000], np.float32), n)),
        "sgd_step": (w, lambda n: _optim.sgd_step(w, g1, np.array([1e-3, 0], np.float32), n)),
        "swiglu": (d4, lambda n: _pointwise.swiglu(a4, b4, d4, n)),
        "sin": (d4, lambda n: _pointwise.sin(a4, d4, n)),
        "cos": (d4, lambda n: _pointwise.cos(a4, d4, n)),
        "sum_rows": (rows, lambda n: _reduce.sum_rows(a4, rows, n)),
        "sum_all": (d1, lambda n: _reduce.sum_all(a4, n)),
        "repeat": (d4, lambda n: _reduce.repeat(_f32(1, 3, 1, 8), d4, n)),
        "repeat_back": (rows, lambda n: _reduce.repeat_back(a4, rows, n)),
        "argmax": (am, lambda n: _reduce.argmax(logits, am, n)),
        "count_equal": (d1, lambda n: _reduce.count_equal(ints, ints, n)),
        "rope": (d4, lambda n: _rope.rope(a4, pos, None, d4, 8, False, 0, 10000.0, 1.0, 0.0,
                                          1.0, 32.0, 1.0, 1.0, n)),
        "soft_max": (d4, lambda n: _softmax.soft_max(a4, d4, 1.0, n)),
        "soft_max_back": (d4, lambda n: _softmax.soft_max_back(a4, b4, d4, 1.0, n)),
        "cross_entropy_loss": (d1, lambda n: _softmax.cross_entropy_loss(logits, labels, n)),
        "cross_entropy_loss_back": (d2, lambda n: _softmax.cross_entropy_loss_back(
            1.0, logits, labels, d2, n)),
        "soft_max_ext": (d4, lambda n: _attention.soft_max_ext(a4, None, d4, 1.0, 0.0, n)),
        "diag_mask": (d4, lambda n: _attention.diag_mask(a4, d4, 0, -np.inf, n)),
        **_quant_calls(),
        "lowp_gemm": (out_lp, lambda n: _lowp.lowp_gemm(w_lp, 30, _f32(5, 9), out_lp, n)),
        **_lowp_calls(),
    }


def _lowp_calls() -> dict[str, tuple[np.ndarray, Callable[[int], object]]]:
    """_lowp.pyx's packing, hash and conversions (the product is in _calls())."""
    w = np.arange(4 * 9, dtype=np.uint16).reshape(4, 9)
    packed = np.full(_lowp.packed_words(30, 4, 9), 7, np.uint32)
    bits, back, hashed = np.full(9, 7, np.uint16), np.full(36, 7.0, np.float32), np.zeros(1)
    return {
        "lowp_pack": (packed, lambda n: np.copyto(packed, _lowp.lowp_pack(w, 30, n))),
        "lowp_hash": (hashed, lambda n: _lowp.lowp_hash(w, n)),
        "f32_to_bf16": (bits, lambda n: _lowp.f32_to_bf16(_f32(9), bits, n)),
        "bf16_to_f32": (back, lambda n: _lowp.bf16_to_f32(w.reshape(-1), back, n)),
    }


def _quant_calls() -> dict[str, tuple[np.ndarray, Callable[[int], object]]]:
    """The kernels of _quant.pyx (Q8_0 blocks of 64-element rows)."""
    q8 = 8
    blocks = np.zeros((2, 3, 4, 68), np.uint8)  # zero scales: every value 0
    values, rows = _f32(2, 3, 4, 64), np.full((2, 3, 4, 64), 7.0, np.float32)
    out_mm, out_op = np.full((5, 4), 7.0, np.float32), np.full((5, 64), 7.0, np.float32)
    act_q = np.full((5, 64), 7, np.int8)
    panels = np.full(_quant_dot.packed_shape(q8, 4, 64), 7, np.uint8)
    return {
        "dequantize_rows": (rows, lambda n: _quant.dequantize_rows(blocks, q8, rows, n)),
        "quantize_rows": (blocks, lambda n: _quant.quantize_rows(values, q8, blocks, n)),
        "get_quantized_rows": (rows, lambda n: _quant.get_quantized_rows(
            blocks, q8, np.zeros((2, 3, 4), np.int32), rows, n)),
        "mul_mat_quantized": (out_mm, lambda n: _quant.mul_mat_quantized(
            blocks[0, 0], q8, _f32(5, 64), out_mm, n)),
        "out_prod_quantized": (out_op, lambda n: _quant.out_prod_quantized(
            blocks[0, 0], q8, _f32(5, 4), out_op, n)),
        "mul_mat_q8": (out_mm, lambda n: _quant_dot.mul_mat_q8(blocks[0, 0], q8, _f32(5, 64),
                                                           out_mm, n)),
        "pack_weight": (panels, lambda n: _quant_dot.pack_weight(blocks[0, 0], q8, panels, n)),
        "quantize_activations": (act_q, lambda n: _quant_dot.quantize_activations(
            _f32(5, 64), q8, act_q, np.zeros((5, 2), np.float32), np.zeros((5, 2), np.float32),
            np.zeros((5, 4), np.int32), n)),
    }


KERNELS = sorted(_calls())


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("n_threads", [0, -1, MAX_N_THREADS + 1, 2**31 - 1])
def test_every_kernel_refuses_bad_thread_counts(name, n_threads):
    dst, call = _calls()[name]
    assert_refuses(InvalidValueError, dst, lambda: call(n_threads), match="n_threads")


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_takes_valid_thread_counts(name):
    """The calls of _calls() are valid: they run, on 1 and 2 threads alike."""
    dst1, call1 = _calls()[name]
    dst2, call2 = _calls()[name]
    assert call1(1) == call2(2)  # the scalar kernels' results, None for the others
    np.testing.assert_array_equal(dst1, dst2)


def test_every_public_kernel_is_covered():
    """A new kernel must be added to _calls() (and so to the thread-count checks)."""
    modules = [_attention, _conv, _conv2d, _copy, _elementwise, _gather, _get_rows, _lowp, _norm,
               _optim, _pool, _pointwise, _quant, _quant_dot, _reduce, _rope, _softmax]
    public = {name for mod in modules for name in dir(mod)
              if not name.startswith("_") and callable(getattr(mod, name))
              and getattr(getattr(mod, name), "__module__", None) == mod.__name__}
    # the kernel choices of _lowp, _quant_dot and _quant (switches) and the sizes of their
    # packed panels: no work of their own
    switches = {"available", "kernel", "set_kernel", "force_portable", "vnni_kernel",
                "set_vectorized", "packed_shape", "packed_words", "has_ggml_tiled"}
    assert public - switches == set(KERNELS)


@pytest.mark.parametrize("name", ["get_rows", "im2col", "pool_2d", "unary", "sum_all", "copy"])
def test_a_missing_array_is_a_type_error(name):
    calls = {
        "get_rows": lambda: _get_rows.get_rows(_f32(1, 1, 2, 2), np.zeros((1, 1, 1), np.int32),
                                               None, 1),
        "im2col": lambda: _conv.im2col(None, np.zeros((2, 6, 7, 36), np.float32), *CFG, 1),
        "pool_2d": lambda: _pool.pool_2d(_f32(1, 1, 2, 2), None, 0, *POOL, 1),
        "unary": lambda: _elementwise.unary(0, _f32(1, 1, 2, 2), None, 1),
        "sum_all": lambda: _reduce.sum_all(None, 1),
        "copy": lambda: _copy.copy(_f32(1, 1, 2, 2), None, 1),
    }
    with pytest.raises(TypeError, match="must not be None|got NoneType"):
        calls[name]()


def test_get_rows_back_empty_dims():
    """No rows in g: dst is zeroed; no columns: valid indices are a no-op, bad ones refused."""
    dst = np.full((3, 2), 7.0, np.float32)
    _get_rows.get_rows_back(np.zeros((0, 2), np.float32), np.zeros(0, np.int32), dst, 2)
    np.testing.assert_array_equal(dst, 0)
    narrow = np.zeros((3, 0), np.float32)
    _get_rows.get_rows_back(np.zeros((2, 0), np.float32), np.array([0, 2], np.int32), narrow, 2)
    with pytest.raises(ShapeError, match=r"idx\[1\] = 3"):
        _get_rows.get_rows_back(np.zeros((2, 0), np.float32), np.array([0, 3], np.int32),
                                narrow, 2)
