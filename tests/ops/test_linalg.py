"""The linalg op family (mul_mat and out_prod) through graphs: forward values against NumPy (1 and
2 threads, odd sizes, views), every refusal of its constructors (with nothing changed), and
finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import ShapeError
from tests.support.arrays import (
    f32,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run1
from tests.support.state import assert_unchanged as _unchanged


def mul_mat_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_mul_mat in NumPy 4-D terms: C[i3,i2] = B[i3,i2] @ A[i3 // r3, i2 // r2].T."""
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape).astype(np.float64)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape).astype(np.float64)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    aa = np.repeat(np.repeat(a4, r3, axis=0), r2, axis=1)
    return b4 @ aa.swapaxes(-1, -2)


# NumPy shapes (A, B): A (A3, A2, M, K), B (B3, B2, N, K)
MUL_MAT = [
    ((7, 5), (3, 5)),
    ((1, 5), (4, 5)),
    ((7, 5), (1, 5)),
    ((2, 6, 9), (2, 4, 9)),
    ((1, 2, 4, 5), (3, 4, 6, 5)),    # broadcast over dims 2 and 3
    ((2, 3, 4, 5), (4, 6, 3, 5)),    # a's i2 = b's i2 // 2, i3 = i3 // 2
    ((33, 65), (47, 65)),
    ((1100, 70), (1, 70)),           # one token: the dot-product path, 3 blocks
    ((3, 40, 64), (3, 2, 64)),       # attention heads over a few tokens
]


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shapes", MUL_MAT, ids=str)
def test_mul_mat(rng, shapes):
    a, b = f32(rng, *shapes[0]), f32(rng, *shapes[1])

    def build(c, ta, tb):
        r = ggopt.mul_mat(c, ta, tb)
        assert r.ne == (ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3])
        return r

    assert_close(run1(build, a, b), mul_mat_ref(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("n_threads")
def test_mul_mat_non_contiguous(rng):
    # a: every other row of a 12x5 matrix (a strided view), b: a transpose.
    a, b = f32(rng, 12, 5), f32(rng, 5, 4)

    def build(c, ta, tb):
        av = ggopt.view_2d(c, ta, 5, 6, 2 * ta.nb[1], ta.nb[1])
        return ggopt.mul_mat(c, av, ggopt.transpose(c, tb))

    assert_close(run1(build, a, b), mul_mat_ref(a[1::2], b.T), rtol=1e-5, atol=1e-5)


# Thin products (a side of at most 16: ``_kernels/_thin.pyx``), shaped as LoRA's: (A, B) NumPy
# shapes for mul_mat, then how B is given ("t": a transposed view of a contiguous tensor)
THIN = [
    ((8, 37), (45, 37), "c"),                  # A x, r = 8
    ((53, 8), (45, 8), "c"),                   # B h, K = 8
    ((53, 8), (8, 45), "t"),                   # B (dh), the transposed view of the backward
    ((2, 3, 5, 19), (4, 3, 33, 19), "c"),      # broadcast over dims 2 and 3
    ((1, 2, 300, 3), (2, 4, 17, 3), "c"),      # K = 3, a broadcast over both
    ((16, 70), (1, 70), "c"),                  # one row: the dots form
]


@pytest.mark.parametrize("a_shape, b_shape, how", THIN, ids=str)
def test_thin_mul_mat_same_bits_for_1_2_3_threads(rng, a_shape, b_shape, how):
    a, b = f32(rng, *a_shape), f32(rng, *b_shape)

    def build(c, ta, tb):
        return ggopt.mul_mat(c, ta, ggopt.transpose(c, tb) if how == "t" else tb)

    outs = []
    try:
        for n in (1, 2, 3):
            ggopt.set_n_threads(n)
            outs.append(run1(build, a, b))
    finally:
        ggopt.set_n_threads(None)
    assert_close(outs[0], mul_mat_ref(a, b.T if how == "t" else b), rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("a_shape, b_shape", [((37, 8), (37, 45)), ((37, 45), (37, 8)),
                                              ((2, 29, 8), (4, 29, 21))], ids=str)
def test_thin_out_prod_same_bits_for_1_2_3_threads(rng, a_shape, b_shape):
    """The adapters' gradients: out_prod(x, dh) (dA), out_prod(h, dy) (dB), and ggml's
    out_prod(A, transpose(dh)) for an input's gradient."""
    a, b = f32(rng, *a_shape), f32(rng, *b_shape)
    bt = np.ascontiguousarray(b.swapaxes(-1, -2))
    outs = []
    try:
        for n in (1, 2, 3):
            ggopt.set_n_threads(n)
            outs.append(run1(lambda c, ta, tb: ggopt.out_prod(c, ta, tb), a, b))
            outs.append(run1(lambda c, ta, tb: ggopt.out_prod(c, ta, ggopt.transpose(c, tb)),
                             a, bt))
    finally:
        ggopt.set_n_threads(None)
    assert_close(outs[0], out_prod_ref(a, b), rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(outs[0], o) for o in outs[2::2])
    assert_close(outs[1], out_prod_ref(a, b), rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(outs[1], o) for o in outs[3::2])


def out_prod_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_out_prod: R[i3,i2] = B[i3,i2].T @ A[i3 // r3, i2 // r2]."""
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape).astype(np.float64)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape).astype(np.float64)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    aa = np.repeat(np.repeat(a4, r3, axis=0), r2, axis=1)
    return b4.swapaxes(-1, -2) @ aa


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shapes", [((5, 7), (5, 3)), ((5, 1), (5, 4)), ((2, 6, 3), (4, 6, 5)),
                                    ((40, 33), (40, 47))], ids=str)
def test_out_prod(rng, shapes):
    a, b = f32(rng, *shapes[0]), f32(rng, *shapes[1])

    def build(c, ta, tb):
        r = ggopt.out_prod(c, ta, tb)
        assert r.ne == (ta.ne[0], tb.ne[0], tb.ne[2], tb.ne[3])
        return r

    assert_close(run1(build, a, b), out_prod_ref(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("n_threads")
def test_out_prod_transposed_b(rng):
    a, b = f32(rng, 5, 7), f32(rng, 3, 5)  # b transposed -> ggml [3,5], NumPy (5,3)
    out = run1(lambda c, ta, tb: ggopt.out_prod(c, ta, ggopt.transpose(c, tb)), a, b)
    assert_close(out, out_prod_ref(a, b.T), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_ne, b_ne, match", [
    ((4, 3), (5, 2), r"a.ne\[0\]=4 must equal b.ne\[0\]=5"),
    ((4, 3, 2), (4, 2, 3), "broadcast"),
    ((4, 3, 1, 2), (4, 2, 1, 3), "broadcast"),
])
def test_mul_mat_shape_mismatch(ctx, a_ne, b_ne, match):
    a, b = ctx.new_tensor(ggopt.F32, a_ne), ctx.new_tensor(ggopt.F32, b_ne)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, a, b), ShapeError, "ggml_mul_mat.*" + match)


def test_mul_mat_transposed_a(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 4, 4), ctx.new_tensor_2d(ggopt.F32, 4, 2)
    at = ggopt.transpose(ctx, a)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, at, b), ShapeError, "transposed")


def test_mul_mat_empty_reduction_says_so(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 0, 3), ctx.new_tensor_2d(ggopt.F32, 0, 4)
    _unchanged(ctx, lambda: ggopt.mul_mat(ctx, a, b), ShapeError, "ne\\[0\\] = 0")


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "mul_mat": (g.mul_mat, [u32(4, 5), u32(3, 5, seed=1)], (0, 1)),
    "mul_mat_vector": (g.mul_mat, [u32(4, 5), u32(1, 5, seed=1)], (0, 1)),
    "mul_mat_3d": (g.mul_mat, [u32(2, 4, 5), u32(2, 3, 5, seed=1)], (0, 1)),
    "mul_mat_broadcast_a2_1": (g.mul_mat, [u32(1, 1, 3, 4), u32(2, 3, 2, 4, seed=1)], (0, 1)),
    "mul_mat_broadcast": (g.mul_mat, [u32(1, 2, 3, 4), u32(2, 4, 2, 4, seed=1)], (0, 1)),
    "mul_mat_broadcast_dim3": (g.mul_mat, [u32(2, 1, 3, 4), u32(4, 1, 2, 4, seed=1)], (0, 1)),
    "mul_mat_transposed_b": (lambda c, a, b: g.mul_mat(c, a, g.transpose(c, b)),
                             [u32(4, 5), u32(5, 3, seed=1)], (0, 1)),
    "out_prod": (g.out_prod, [u32(5, 4), u32(5, 3, seed=1)], (0, 1)),
    "out_prod_broadcast": (g.out_prod, [u32(1, 2, 5, 4), u32(2, 4, 5, 3, seed=1)], (0, 1)),
    # LoRA-like: a side of 2 (ThinPlan) against sides of 17 and 19
    "mul_mat_thin": (g.mul_mat, [u32(2, 19), u32(17, 19, seed=1)], (0, 1)),
    "out_prod_thin": (g.out_prod, [u32(17, 2), u32(17, 19, seed=1)], (0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/linalg.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.linalg")
    assert rules and rules - ops == set()
