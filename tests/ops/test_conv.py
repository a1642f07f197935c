"""The conv op family (im2col, conv_2d (im2col and direct), their gradient ops, pool_2d) through
graphs: forward values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import (
    DTypeError,
    ShapeError,
)
from ggopt import backend as gb
from tests.support.arrays import (
    f32,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, distinct, u32
from tests.support.helpers import assert_close, check_grads, run1
from tests.support.state import assert_unchanged as _unchanged

# (KH, KW, s0, s1, p0, p1, d0, d1); index 0 acts on the width, 1 on the height
CONV = [
    (3, 3, 1, 1, 1, 1, 1, 1),
    (3, 3, 1, 1, 0, 0, 1, 1),
    (2, 3, 2, 1, 0, 1, 1, 1),
    (3, 2, 1, 2, 2, 0, 2, 1),
    (1, 1, 1, 1, 0, 0, 1, 1),
]


def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col_ref(x: np.ndarray, KH, KW, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    N, IC, IH, IW = x.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    out = np.zeros((N, OH, OW, IC, KH, KW), np.float32)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                    if 0 <= iy < IH and 0 <= ix < IW:
                        out[:, oh, ow, :, kh, kw] = x[:, :, iy, ix]
    return out.reshape(N, OH, OW, IC * KH * KW)


def im2col_back_ref(g: np.ndarray, x_shape, KH, KW, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    N, IC, IH, IW = x_shape
    OH, OW = g.shape[1], g.shape[2]
    g6 = g.reshape(N, OH, OW, IC, KH, KW).astype(np.float64)
    out = np.zeros(x_shape)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                    if 0 <= iy < IH and 0 <= ix < IW:
                        out[:, :, iy, ix] += g6[:, oh, ow, :, kh, kw]
    return out


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_im2col_and_back(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 4, 3, KH, KW)

    def build(c, tx, tk):
        return ggopt.im2col(c, tk, tx, s0, s1, p0, p1, d0, d1, True, ggopt.F32)

    cols = run1(build, x, k)
    ref = im2col_ref(x, KH, KW, s0, s1, p0, p1, d0, d1)
    assert cols.shape == ref.shape
    assert_close(cols, ref)

    g = f32(rng, *ref.shape)

    def build_back(c, tg, tk):
        return ggopt.im2col_back(c, tg, tk, (6, 7, 3, 2), s0, s1, p0, p1, d0, d1)

    back = run1(build_back, g, k)
    assert_close(back, im2col_back_ref(g, x.shape, KH, KW, s0, s1, p0, p1, d0, d1),
                 rtol=1e-5, atol=1e-5)
    # adjoint identity <im2col(x), g> == <x, im2col_back(g)>
    np.testing.assert_allclose((cols.astype(np.float64) * g).sum(),
                               (x.astype(np.float64) * back).sum(), rtol=1e-5)


def conv2d_ref(x: np.ndarray, k: np.ndarray, s0, s1, p0, p1, d0, d1) -> np.ndarray:
    """Direct cross-correlation, NCHW input, (OC, IC, KH, KW) kernel."""
    N, IC, IH, IW = x.shape
    OC, _, KH, KW = k.shape
    OH, OW = _conv_out(IH, KH, s1, p1, d1), _conv_out(IW, KW, s0, p0, d0)
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    xp[:, :, p1:p1 + IH, p0:p0 + IW] = x
    out = np.zeros((N, OC, OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            patch = xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
                       kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0]
            out += np.einsum("nchw,oc->nohw", patch, k[:, :, kh, kw])
    return out


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_conv_2d(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 5, 3, KH, KW)

    def build(c, tx, tk):
        return ggopt.conv_2d(c, tk, tx, s0, s1, p0, p1, d0, d1)

    out = run1(build, x, k)
    ref = conv2d_ref(x, k, s0, s1, p0, p1, d0, d1)
    assert out.shape == ref.shape
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


def conv2d_back_input_ref(k: np.ndarray, g: np.ndarray, x_shape, s0, s1, p0, p1, d0,
                          d1) -> np.ndarray:
    """The adjoint of :func:`conv2d_ref` in its input."""
    N, IC, IH, IW = x_shape
    _, _, KH, KW = k.shape
    OH, OW = g.shape[2], g.shape[3]
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    for kh in range(KH):
        for kw in range(KW):
            xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
               kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0] += np.einsum(
                "nohw,oc->nchw", g, k[:, :, kh, kw])
    return xp[:, :, p1:p1 + IH, p0:p0 + IW]


def conv2d_back_kernel_ref(x: np.ndarray, g: np.ndarray, k_shape, s0, s1, p0, p1, d0,
                           d1) -> np.ndarray:
    """The gradient of ``sum(conv2d_ref(x, k) * g)`` in ``k``."""
    N, IC, IH, IW = x.shape
    _, _, KH, KW = k_shape
    OH, OW = g.shape[2], g.shape[3]
    xp = np.zeros((N, IC, IH + 2 * p1 + KH * d1, IW + 2 * p0 + KW * d0))
    xp[:, :, p1:p1 + IH, p0:p0 + IW] = x
    out = np.zeros(k_shape)
    for kh in range(KH):
        for kw in range(KW):
            patch = xp[:, :, kh * d1: kh * d1 + (OH - 1) * s1 + 1: s1,
                       kw * d0: kw * d0 + (OW - 1) * s0 + 1: s0]
            out[:, :, kh, kw] = np.einsum("nchw,nohw->oc", patch, g)
    return out


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("cfg", CONV, ids=str)
def test_conv_2d_direct_and_its_gradient_ops(rng, cfg):
    KH, KW, s0, s1, p0, p1, d0, d1 = cfg
    prm = (s0, s1, p0, p1, d0, d1)
    x, k = f32(rng, 2, 3, 7, 6), f32(rng, 5, 3, KH, KW)
    out = run1(lambda c, tx, tk: ggopt.conv_2d_direct(c, tk, tx, *prm), x, k)
    assert_close(out, conv2d_ref(x, k, *prm), rtol=1e-5, atol=1e-5)
    g = f32(rng, *out.shape)
    dx = run1(lambda c, tk, tg: ggopt.conv_2d_back_input(c, tk, tg, (6, 7, 3, 2), *prm), k, g)
    assert_close(dx, conv2d_back_input_ref(k, g, x.shape, *prm), rtol=1e-5, atol=1e-5)
    dk = run1(lambda c, tx, tg: ggopt.conv_2d_back_kernel(c, tx, tg, (KW, KH, 3, 5), *prm), x, g)
    assert_close(dk, conv2d_back_kernel_ref(x, g, k.shape, *prm), rtol=1e-5, atol=1e-4)


@pytest.mark.usefixtures("n_threads")
def test_conv_2d_is_one_direct_node():
    ctx = ggopt.Context()
    x = ctx.new_tensor_4d(ggopt.F32, 6, 7, 3, 2)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 3, 5)
    y = ggopt.conv_2d(ctx, k, x, 1, 1, 1, 1, 1, 1)
    assert y.op is ggopt.tensor.Op.CONV_2D and y.src[:2] == (k, x) and y.ne == (6, 7, 5, 2)
    assert y.op_params == ggopt.ops.Conv2DParams(1, 1, 1, 1, 1, 1)


@pytest.mark.usefixtures("n_threads")
def test_conv_2d_permuted_input(rng):
    # the input arrives NHWC and is permuted to ggml [W, H, C, N] without a copy
    x_nhwc, k = f32(rng, 2, 6, 5, 3), f32(rng, 4, 3, 3, 3)

    def build(c, tx, tk):
        return ggopt.conv_2d(c, tk, ggopt.permute(c, tx, 2, 0, 1, 3), 1, 1, 1, 1, 1, 1)

    ref = conv2d_ref(x_nhwc.transpose(0, 3, 1, 2), k, 1, 1, 1, 1, 1, 1)
    assert_close(run1(build, x_nhwc, k), ref, rtol=1e-5, atol=1e-5)


# (k0, k1, s0, s1, p0, p1); index 0 acts on the width
POOL = [
    (2, 2, 2, 2, 0, 0),
    (3, 3, 2, 2, 0, 0),
    (3, 3, 2, 2, 1, 1),
    (2, 3, 1, 2, 1, 0),
    (3, 2, 3, 1, 0, 1),
]


def _pool_out(size, k, s, p):
    return int(np.float32(size + 2 * p - k) / np.float32(s)) + 1


def _windows(x_shape, k0, k1, s0, s1, p0, p1):
    """Yield (oh, ow, [(iy, ix) in-bounds cells in scan order])."""
    IH, IW = x_shape[2], x_shape[3]
    for oh in range(_pool_out(IH, k1, s1, p1)):
        for ow in range(_pool_out(IW, k0, s0, p0)):
            cells = [(oh * s1 - p1 + ky, ow * s0 - p0 + kx) for ky in range(k1) for kx in range(k0)]
            yield oh, ow, [(y, x) for y, x in cells if 0 <= y < IH and 0 <= x < IW]


def pool_ref(x: np.ndarray, op: int, k0, k1, s0, s1, p0, p1) -> np.ndarray:
    N, C, IH, IW = x.shape
    out = np.zeros((N, C, _pool_out(IH, k1, s1, p1), _pool_out(IW, k0, s0, p0)), np.float64)
    for oh, ow, cells in _windows(x.shape, k0, k1, s0, s1, p0, p1):
        vals = np.stack([x[:, :, y, xx] for y, xx in cells], -1).astype(np.float64)
        if op == ggopt.OP_POOL_MAX:
            out[:, :, oh, ow] = vals.max(-1)
        else:
            out[:, :, oh, ow] = vals.sum(-1) / (k0 * k1)  # padding counts as 0
    return out


def pool_back_ref(g, x, op, k0, k1, s0, s1, p0, p1) -> np.ndarray:
    out = np.zeros(x.shape, np.float64)
    N, C = x.shape[:2]
    for oh, ow, cells in _windows(x.shape, k0, k1, s0, s1, p0, p1):
        for n in range(N):
            for c in range(C):
                if op == ggopt.OP_POOL_MAX:
                    vals = [x[n, c, y, xx] for y, xx in cells]
                    y, xx = cells[int(np.argmax(vals))]  # the first maximum in scan order
                    out[n, c, y, xx] += g[n, c, oh, ow]
                else:
                    for y, xx in cells:
                        out[n, c, y, xx] += g[n, c, oh, ow] / (k0 * k1)
    return out


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("op", [ggopt.OP_POOL_MAX, ggopt.OP_POOL_AVG], ids=["max", "avg"])
@pytest.mark.parametrize("cfg", POOL, ids=str)
def test_pool_2d_and_back(rng, op, cfg):
    x = f32(rng, 2, 3, 7, 6)
    if op == ggopt.OP_POOL_MAX:
        x[0, 0, :2, :2] = 3.0  # ties: the gradient goes to the first maximum only
    k0, k1, s0, s1, p0, p1 = cfg
    out = run1(lambda c, t: ggopt.pool_2d(c, t, op, *cfg), x)
    ref = pool_ref(x, op, *cfg)
    assert out.shape == ref.shape
    assert_close(out, ref, rtol=1e-6, atol=1e-6)

    g = f32(rng, *ref.shape)
    back = run1(lambda c, tg, tx: ggopt.pool_2d_back(c, tg, tx, op, *cfg), g, x)
    assert_close(back, pool_back_ref(g, x, op, *cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("n_threads")
def test_pool_2d_transposed_input(rng):
    x = f32(rng, 1, 2, 6, 8)  # transpose -> ggml [6,8,2,1]: NumPy (1,2,8,6)
    out = run1(lambda c, t: ggopt.pool_2d(c, ggopt.transpose(c, t), ggopt.OP_POOL_MAX,
                                          2, 2, 2, 2, 0, 0), x)
    assert_close(out, pool_ref(x.swapaxes(2, 3), ggopt.OP_POOL_MAX, 2, 2, 2, 2, 0, 0))


def test_conv_2d_direct_and_gradient_op_validation(ctx):
    x = ctx.new_tensor_4d(ggopt.F32, 6, 7, 2, 3)
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 2, 4)
    g = ctx.new_tensor_4d(ggopt.F32, 6, 7, 4, 3)   # the output of stride 1, padding 1
    prm = (1, 1, 1, 1, 1, 1)
    xi = ctx.new_tensor_4d(ggopt.I32, 6, 7, 2, 3)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, xi, *prm), DTypeError, "F32")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 0, 1, 1, 1, 1), ShapeError,
               "s1 must be >= 1")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, -1, 1, 1, 1), ShapeError,
               "p0 must be >= 0")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, 1, 1, 1, 2**31), ShapeError,
               "d1 must be < 2..31")
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k, x, 1, 1, 1, 1, 1.5, 1), DTypeError,
               "d0 must be an int")
    k3 = ctx.new_tensor_4d(ggopt.F32, 3, 3, 3, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k3, x, *prm), ShapeError, "channels")
    k9 = ctx.new_tensor_4d(ggopt.F32, 9, 3, 2, 4)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k9, x, 1, 1, 0, 0, 1, 1), ShapeError,
               "empty output")
    wide = ctx.new_tensor_4d(ggopt.F32, 2**16, 2**15, 1, 1)   # 2**31 output positions
    k1 = ctx.new_tensor_4d(ggopt.F32, 1, 1, 1, 1)
    _unchanged(ctx, lambda: ggopt.conv_2d_direct(ctx, k1, wide, 1, 1, 0, 0, 1, 1), ShapeError,
               "below 2..31")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, g, (6, 8, 2, 3), *prm), ShapeError,
               r"gradient \[6, 7, 4, 3\] must be \[6, 8, 4, 3\]")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, g, (6, 7, 3, 3), *prm), ShapeError,
               "channels")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_input(ctx, k, xi, (6, 7, 2, 3), *prm), DTypeError,
               "F32")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 5), *prm), ShapeError,
               "must be")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 4), 2, 1, 1, 1, 1, 1),
               ShapeError, "must be")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 5, 4), *prm), ShapeError,
               "channels")
    _unchanged(ctx, lambda: ggopt.conv_2d_back_kernel(None, x, g, (3, 3, 2, 4), *prm),
               DTypeError, "Context")
    # consistent arguments build
    assert ggopt.conv_2d_back_kernel(ctx, x, g, (3, 3, 2, 4), *prm).ne == k.ne
    assert ggopt.conv_2d_back_input(ctx, k, g, x.ne, *prm).ne == x.ne


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "im2col": (lambda c, x, k: g.im2col(c, k, x, 2, 1, 1, 0, 1, 2, True, g.F32),
               [u32(1, 2, 5, 6), u32(3, 2, 3, 3, seed=1)], (0,)),
    "conv_2d": (lambda c, x, k: g.conv_2d(c, k, x, 2, 1, 1, 1, 1, 1),
                [u32(2, 2, 4, 5), u32(3, 2, 3, 3, seed=1)], (0, 1)),
    "conv_2d_direct_rows": (lambda c, x, k: g.conv_2d_direct(c, k, x, 1, 2, 1, 2, 2, 1),
                            [u32(2, 2, 6, 7), u32(3, 2, 3, 2, seed=1)], (0, 1)),
    "conv_2d_direct_positions": (lambda c, x, k: g.conv_2d_direct(c, k, x, 3, 1, 2, 0, 1, 2),
                                 [u32(1, 3, 7, 6), u32(2, 3, 2, 3, seed=1)], (0, 1)),
    "pool_2d_max": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_MAX, 2, 2, 2, 2, 0, 0),
                    [distinct(1, 2, 6, 7)], (0,)),
    "pool_2d_max_overlap_pad": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_MAX, 3, 3, 2, 1, 1, 1),
                                [distinct(1, 2, 5, 6)], (0,)),
    "pool_2d_avg": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_AVG, 3, 2, 2, 1, 1, 0),
                    [u32(1, 2, 5, 6)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/conv.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.conv")
    assert rules and rules - ops == set()


def _compute(out, ctx):
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    sched = gb.Scheduler([gb.cpu_init()])
    sched.graph_compute(g)
    return out


def _host_ctx():
    return ggopt.Context(no_alloc=False)


def test_im2col_with_huge_stride_and_padding_needs_little_memory():
    ctx = _host_ctx()
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1)
    x = ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1)
    x.numpy()[:] = np.arange(64, dtype=np.float32).reshape(x.shape)
    s, p = 2**31 - 1, 2**30
    cols = ggopt.im2col(ctx, k, x, s, s, p, p, 1, 1)
    assert cols.ne == (9, 2, 2, 1)
    _compute(cols, ctx)
    # reference: every window lies in the zero padding except where it covers the image
    got = cols.numpy()
    want = np.zeros_like(got)
    img = x.numpy().reshape(8, 8)
    for oh in range(2):
        for ow in range(2):
            for kh in range(3):
                for kw in range(3):
                    iy, ix = oh * s + kh - p, ow * s + kw - p
                    if 0 <= iy < 8 and 0 <= ix < 8:
                        want[oh, ow, kh * 3 + kw] = img[iy, ix]
    assert np.array_equal(got, want)


def test_im2col_back_with_huge_stride_and_padding_needs_little_memory():
    ctx = _host_ctx()
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1)
    g = ctx.new_tensor_4d(ggopt.F32, 9, 2, 2, 1)
    g.numpy()[:] = 1.0
    s, p = 2**31 - 1, 2**30
    out = ggopt.im2col_back(ctx, g, k, (8, 8, 1, 1), s, s, p, p, 1, 1)
    _compute(out, ctx)
    assert np.all(out.numpy() == 0.0)  # every window reads the padding only
