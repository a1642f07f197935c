"""The reduce op family (sum sum_rows mean repeat repeat_back argmax count_equal) through graphs:
forward values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from tests.support.arrays import (
    LAYOUTS,
    f32,
    layout_input,
    tile_to,
    untile,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run, run1
from tests.support.sizes import LARGE_BY_5, LARGE_TALL


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sum_sum_rows_mean(rng, layout):
    x, view, xin = layout_input(rng, layout, -2, 2)
    s, sr, mn = run(lambda c, t: [ggopt.sum(c, view(c, t)), ggopt.sum_rows(c, view(c, t)),
                                  ggopt.mean(c, view(c, t))], x)
    x64 = xin.astype(np.float64)
    assert_close(s, x64.sum(), rtol=1e-6)
    assert_close(sr, x64.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-5)
    assert_close(mn, x64.mean(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("n_threads")
def test_sum_accumulates_accurately():
    # 0.1f summed over 300,000 times: a float32 running sum is off by ~1e-3 relative.
    x = np.full(LARGE_TALL, 0.1, np.float32)
    s = run1(ggopt.sum, x)
    assert_close(s, x.astype(np.float64).sum(), rtol=1e-6)


@pytest.mark.usefixtures("n_threads")
def test_sum_rows_4d_shape(rng):
    x = f32(rng, 2, 3, 4, 5)

    def build(c, t):
        r = ggopt.sum_rows(c, t)
        assert r.ne == (1, 4, 3, 2)
        return r

    assert_close(run1(build, x), x.sum(axis=-1, keepdims=True), atol=1e-5)


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shapes", [((1, 3, 1), (2, 3, 4)), ((2, 3), (4, 9)), ((3,), (2, 3, 6)),
                                    ((1, 5), LARGE_BY_5)], ids=str)
def test_repeat_and_repeat_back(rng, shapes):
    small, big = shapes
    a, b = f32(rng, *small), f32(rng, *big)
    small_full = (1,) * (len(big) - len(small)) + small

    def build(c, ta, tb):
        return [ggopt.repeat(c, ta, tb), ggopt.repeat_back(c, tb, ta)]

    rep, back = run(build, a, b)
    assert_close(rep, tile_to(a.reshape(small_full), big))
    assert_close(back, untile(b, small_full), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("n_threads")
def test_repeat_of_transposed(rng):
    a = f32(rng, 3, 2)  # transpose -> ggml [3,2], NumPy (2,3)
    b = f32(rng, 4, 6)
    out = run1(lambda c, ta, tb: ggopt.repeat(c, ggopt.transpose(c, ta), tb), a, b)
    assert_close(out, np.tile(a.T, (2, 2)))


@pytest.mark.usefixtures("n_threads")
def test_argmax_last_max_on_ties(rng):
    x = rng.integers(0, 3, (9, 5)).astype(np.float32)  # many ties
    x[0] = [-1, -1, -1, -1, -1]
    out = run1(ggopt.argmax, x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1))


@pytest.mark.usefixtures("n_threads")
def test_argmax_large_and_transposed(rng):
    x = f32(rng, 300, 129)
    out = run1(ggopt.argmax, x)
    np.testing.assert_array_equal(out, np.argmax(x, axis=1))
    out = run1(lambda c, t: ggopt.argmax(c, ggopt.transpose(c, t)), x)
    np.testing.assert_array_equal(out, np.argmax(x.T, axis=1))


@pytest.mark.usefixtures("n_threads")
def test_count_equal(rng):
    a = rng.integers(0, 4, (3, 11)).astype(np.int32)
    b = rng.integers(0, 4, (3, 11)).astype(np.int32)
    out = run1(ggopt.count_equal, a, b)
    assert out.dtype == np.int64
    assert int(out.reshape(())) == int((a == b).sum())


@pytest.mark.usefixtures("n_threads")
def test_argmax_count_equal_chain(rng):
    logits, labels = f32(rng, 37, 10), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 37)]
    out = run1(lambda c, x, y: ggopt.count_equal(c, ggopt.argmax(c, x), ggopt.argmax(c, y)),
               logits, labels)
    assert int(out.reshape(())) == int((logits.argmax(1) == labels.argmax(1)).sum())


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "sum": (g.sum, [u32(3, 5)], (0,)),
    "sum_rows": (g.sum_rows, [u32(2, 3, 5)], (0,)),
    "mean": (g.mean, [u32(2, 3, 5)], (0,)),
    "repeat": (g.repeat, [u32(1, 3), np.zeros((4, 6), np.float32)], (0,)),
    "repeat_back": (g.repeat_back, [u32(4, 6), np.zeros((2, 3), np.float32)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/reduce.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.reduce")
    assert rules and rules - ops == set()
