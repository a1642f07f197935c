"""The views op family (view reshape permute transpose cont dup cpy acc concat) through graphs:
forward values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import (
    ShapeError,
)
from ggopt import backend as gb
from tests.support.arrays import (
    f32,
    to_ggml_order,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run, run1
from tests.support.state import assert_unchanged as _unchanged


def _strided(flat: np.ndarray, ne: tuple[int, ...], nb: tuple[int, ...], offset: int):
    """A NumPy view of ``flat`` (float32) with ggml shape ``ne``, byte strides ``nb``."""
    return np.lib.stride_tricks.as_strided(flat[offset // 4:], shape=ne[::-1], strides=nb[::-1])


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("case", ["2d", "3d"])
def test_acc(rng, case):
    if case == "2d":
        a, b = f32(rng, 4, 6), f32(rng, 2, 3)
        nb = (4, 6 * 4, 6 * 4 * 2, 6 * 4 * 2)
        offset = (1 * 6 + 2) * 4
    else:
        a, b = f32(rng, 3, 4, 6), f32(rng, 2, 3, 2)
        nb = (4, 6 * 4, 6 * 4 * 4, 6 * 4 * 4 * 2)
        offset = (1 * 24 + 1 * 6 + 3) * 4

    out = run1(lambda c, ta, tb: ggopt.acc(c, ta, tb, nb[1], nb[2], nb[3], offset), a, b)
    ref = a.copy().reshape(-1)
    _strided(ref, b.shape[::-1], nb[:b.ndim], offset)[...] += b
    assert_close(out, ref.reshape(a.shape))


@pytest.mark.usefixtures("n_threads")
def test_views(rng):
    x = f32(rng, 3, 4, 5)  # ggml [5,4,3]
    nb1, nb2 = 5 * 4, 20 * 4

    def build(c, t):
        return [
            ggopt.cont(c, ggopt.view_1d(c, t, 7, 3 * 4)),
            ggopt.cont(c, ggopt.view_2d(c, t, 3, 4, nb1, 2 * 4)),
            ggopt.cont(c, ggopt.view_3d(c, t, 2, 3, 2, nb1, nb2, nb2 + nb1 + 4)),
            ggopt.sqr(c, ggopt.view_4d(c, t, 4, 2, 1, 3, 2 * nb1, nb2, nb2, 4)),
        ]

    v1, v2, v3, v4 = run(build, x)
    assert_close(v1, x.reshape(-1)[3:10])
    assert_close(v2, x[0, :, 2:5])
    assert_close(v3, x[1:3, 1:4, 1:3])
    assert_close(v4, np.square(x[:, 0:4:2, 1:5]).reshape(3, 1, 2, 4))


@pytest.mark.usefixtures("n_threads")
def test_reshapes(rng):
    x = f32(rng, 2, 3, 4, 5)
    like = np.zeros((6, 20), np.float32)

    def build(c, t, tl):
        return [
            ggopt.cont(c, ggopt.reshape_1d(c, t, 120)),
            ggopt.cont(c, ggopt.reshape_2d(c, t, 10, 12)),
            ggopt.sqr(c, ggopt.reshape_3d(c, t, 6, 5, 4)),
            ggopt.cont(c, ggopt.reshape_4d(c, t, 3, 4, 5, 2)),
            ggopt.cont(c, ggopt.reshape(c, t, tl)),
        ]

    r1, r2, r3, r4, r5 = run(build, x, like)
    assert r2.shape == (12, 10) and r3.shape == (4, 5, 6) and r4.shape == (2, 5, 4, 3)
    assert_close(r1, x.reshape(120))
    assert_close(r2, x.reshape(12, 10))
    assert_close(r3, np.square(x).reshape(4, 5, 6))
    assert_close(r4, x.reshape(2, 5, 4, 3))
    assert_close(r5, x.reshape(6, 20))


def permute_ref(x: np.ndarray, axes) -> np.ndarray:
    """ggml_permute on a 4-D NumPy-order array: source dim i moves to position axes[i]."""
    inv = [0] * 4
    for i, ax in enumerate(axes):
        inv[ax] = i
    return to_ggml_order(np.transpose(to_ggml_order(x), inv))


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("axes", [(1, 2, 0, 3), (2, 0, 3, 1), (0, 1, 3, 2), (3, 2, 1, 0),
                                  (1, 0, 2, 3)], ids=str)
def test_permute(rng, axes):
    x = f32(rng, 2, 3, 4, 5)

    def build(c, t):
        p = ggopt.permute(c, t, *axes)
        return [ggopt.cont(c, p), ggopt.scale(c, p, 2.0)]

    cont, scaled = run(build, x)
    ref = permute_ref(x, axes)
    assert cont.shape == ref.shape
    assert_close(cont, ref)
    assert_close(scaled, 2 * ref)


@pytest.mark.usefixtures("n_threads")
def test_transpose_cont_dup(rng):
    x = f32(rng, 3, 4, 5)

    def build(c, t):
        tr = ggopt.transpose(c, t)
        return [ggopt.cont(c, tr), ggopt.dup(c, tr), ggopt.dup(c, t)]

    cont, dup_t, dup = run(build, x)
    assert_close(cont, x.swapaxes(1, 2))
    assert_close(dup_t, x.swapaxes(1, 2))
    assert_close(dup, x)


@pytest.mark.usefixtures("n_threads")
def test_cpy_type_conversions(rng):
    x32 = f32(rng, 3, 5) * np.float32(100.0)
    x16 = f32(rng, 3, 5).astype(np.float16)
    dst16 = np.zeros((3, 5), np.float16)
    dst32 = np.zeros((5, 3), np.float32)

    def build(c, a32, a16, d16, d32):
        r16 = ggopt.cpy(c, a32, d16)
        r32 = ggopt.cpy(c, ggopt.transpose(c, a16), d32)
        assert r16.type is ggopt.F16 and r16.view_src is d16
        return [r16, r32]

    r16, r32 = run(build, x32, x16, dst16, dst32)
    assert r16.dtype == np.float16 and r32.dtype == np.float32
    np.testing.assert_array_equal(r16, x32.astype(np.float16))
    np.testing.assert_array_equal(r32, x16.T.astype(np.float32))


@pytest.mark.usefixtures("n_threads")
def test_cpy_reshapes_in_ggml_order(rng):
    x = f32(rng, 3, 4)  # transpose -> ggml [3,4]: NumPy (4,3); copied into a flat [12]
    out = run1(lambda c, t, d: ggopt.cpy(c, ggopt.transpose(c, t), d), x, np.zeros(12, np.float32))
    assert_close(out, x.T.reshape(-1))


def test_reshape_wrong_element_count(ctx):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    _unchanged(ctx, lambda: ggopt.reshape_2d(ctx, a, 5, 3), ShapeError,
               r"ggml_reshape_2d: cannot reshape 12 elements .* \(15 elements\)")
    _unchanged(ctx, lambda: ggopt.reshape_1d(ctx, a, 11), ShapeError, "ggml_reshape_1d")
    like = ctx.new_tensor_1d(ggopt.F32, 4)
    _unchanged(ctx, lambda: ggopt.reshape(ctx, a, like), ShapeError, "ggml_reshape")


def test_reshape_non_contiguous(ctx):
    at = ggopt.transpose(ctx, ctx.new_tensor_2d(ggopt.F32, 4, 3))
    _unchanged(ctx, lambda: ggopt.reshape_1d(ctx, at, 12), ShapeError, "contiguous")


@pytest.mark.parametrize("make", [
    lambda c, a: ggopt.view_1d(c, a, 13, 0),
    lambda c, a: ggopt.view_1d(c, a, 4, 36),
    lambda c, a: ggopt.view_1d(c, a, 1, -4),
    lambda c, a: ggopt.view_2d(c, a, 4, 3, 20, 0),
    lambda c, a: ggopt.view_3d(c, a, 2, 2, 2, 16, 48, 0),
    lambda c, a: ggopt.view_4d(c, a, 1, 1, 1, 2, 4, 4, 48, 4),
], ids=["1d_too_long", "1d_offset", "negative_offset", "2d_stride", "3d", "4d"])
def test_view_out_of_bounds(ctx, make):
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)  # 48 bytes
    _unchanged(ctx, lambda: make(ctx, a), ShapeError, r"ggml_view_\dd: .* does not fit in the 48")


def test_view_of_view_out_of_bounds(ctx):
    a = ctx.new_tensor_1d(ggopt.F32, 10)
    v = ggopt.view_1d(ctx, a, 5, 16)  # elements 4..8
    ggopt.view_1d(ctx, v, 6, 0)  # elements 4..9: still inside a
    _unchanged(ctx, lambda: ggopt.view_1d(ctx, v, 7, 0), ShapeError, "does not fit")


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "acc": (lambda c, a, b: g.acc(c, a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 8),
            [u32(4, 6), u32(2, 3, seed=1)], (0, 1)),
    "view_1d": (lambda c, a: g.view_1d(c, a, 7, 12), [u32(3, 5)], (0,)),
    "view_2d": (lambda c, a: g.view_2d(c, a, 3, 2, a.nb[1], 8), [u32(3, 5)], (0,)),
    "view_3d": (lambda c, a: g.view_3d(c, a, 2, 2, 2, a.nb[1], a.nb[2], a.nb[1] + 4),
                [u32(3, 3, 4)], (0,)),
    "view_4d": (lambda c, a: g.view_4d(c, a, 2, 2, 1, 2, 2 * a.nb[1], a.nb[2], a.nb[2], 4),
                [u32(2, 4, 5)], (0,)),
    "reshape_1d": (lambda c, a: g.reshape_1d(c, a, 15), [u32(3, 5)], (0,)),
    "reshape_2d": (lambda c, a: g.reshape_2d(c, a, 6, 5), [u32(2, 3, 5)], (0,)),
    "reshape_3d": (lambda c, a: g.reshape_3d(c, a, 5, 3, 2), [u32(6, 5)], (0,)),
    "reshape_4d": (lambda c, a: g.reshape_4d(c, a, 2, 3, 1, 5), [u32(6, 5)], (0,)),
    "reshape": (g.reshape, [u32(6, 5), np.zeros((3, 10), np.float32)], (0,)),
    "permute": (lambda c, a: g.permute(c, a, 2, 0, 3, 1), [u32(2, 3, 2, 4)], (0,)),
    "transpose": (g.transpose, [u32(3, 5)], (0,)),
    "cont": (lambda c, a: g.cont(c, g.permute(c, a, 1, 2, 0, 3)), [u32(2, 3, 4)], (0,)),
    "dup": (lambda c, a: g.dup(c, g.transpose(c, a)), [u32(3, 5)], (0,)),
    "cpy": (lambda c, a, b: g.cpy(c, g.transpose(c, a), b),
            [u32(3, 5), np.zeros(15, np.float32)], (0,)),
    "concat_dim0": (lambda c, a, b: g.concat(c, a, b, 0), [u32(2, 3, 4), u32(2, 3, 2, seed=1)],
                    (0, 1)),
    "concat_dim2": (lambda c, a, b: g.concat(c, a, b, 2), [u32(1, 3, 4), u32(2, 3, 4, seed=1)],
                    (0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/views.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.views")
    assert rules and rules - ops == set()


def _two_tensors():
    ctx = ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, 16)
    b = ctx.new_tensor_1d(ggopt.F32, 16)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    return ctx, a, b


@pytest.mark.parametrize("make", [
    lambda ctx, b: ggopt.view_2d(ctx, b, 4, 4, -64, 0),
    lambda ctx, b: ggopt.view_2d(ctx, b, 4, 2, -16, 32),
    lambda ctx, b: ggopt.view_3d(ctx, b, 2, 2, 2, 8, -16, 32),
    lambda ctx, b: ggopt.view_4d(ctx, b, 2, 1, 1, 2, 8, 8, -8, 32),
])
def test_negative_view_strides_are_refused(make):
    ctx, a, b = _two_tensors()
    n = len(ctx)
    with pytest.raises(ShapeError, match="stride"):
        make(ctx, b)
    assert len(ctx) == n


def test_acc_with_negative_stride_is_refused():
    ctx, a, b = _two_tensors()
    small = ctx.new_tensor_2d(ggopt.F32, 2, 2)
    with pytest.raises(ShapeError, match="stride"):
        ggopt.acc(ctx, a, small, -64, 0, 0, 32)
    with pytest.raises(ShapeError, match="stride"):
        ggopt.acc(ctx, a, ctx.new_tensor_3d(ggopt.F32, 2, 1, 2), 8, -8, 0, 32)


def test_inplace_op_through_a_view_stays_inside_its_tensor():
    ctx, a, b = _two_tensors()
    a.numpy()[:] = 7.0
    b.numpy()[:] = 1.0
    v = ggopt.view_2d(ctx, b, 4, 4, 16, 0)  # the whole of b, in bounds
    out = ggopt.scale_inplace(ctx, v, 3.0)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
    assert np.all(b.numpy() == 3.0) and np.all(a.numpy() == 7.0)
