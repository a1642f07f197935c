"""The pointwise op family (swiglu (GLU), sin cos add1 and silu_back) through graphs: forward
values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its constructors
(with nothing changed), and finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from tests.support.arrays import f32, transposed
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import GradProblem, assert_close, check_grads, run, run1


@pytest.mark.usefixtures("n_threads")
def test_swiglu_sin_cos_add1_concat(rng):
    a, b, s = f32(rng, 3, 4, 10, lo=-5, hi=5), f32(rng, 3, 4, 5), f32(rng, 1)
    outs = run(lambda c, x, y, z: [ggopt.swiglu(c, x), ggopt.swiglu_swapped(c, x),
                                   ggopt.swiglu_split(c, y, y),
                                   ggopt.sin(c, x), ggopt.cos(c, transposed(c, x)),
                                   ggopt.add1(c, y, z), ggopt.concat(c, x, y, 0),
                                   ggopt.concat(c, y, y, 2)], a, b, s)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)

    def silu(v):
        return v / (1 + np.exp(-v))

    assert_close(outs[0], silu(a64[..., :5]) * a64[..., 5:], rtol=2e-6)
    assert_close(outs[1], silu(a64[..., 5:]) * a64[..., :5], rtol=2e-6)
    assert_close(outs[2], silu(b64) * b64, rtol=2e-6)
    assert_close(outs[3], np.sin(a64), rtol=1e-6, atol=1e-6)
    assert_close(outs[4], np.cos(a64), rtol=1e-6, atol=1e-6)
    assert_close(outs[5], b64 + s[0], rtol=1e-7)
    assert_close(outs[6], np.concatenate([a64, b64], axis=-1), rtol=0, atol=0)
    assert_close(outs[7], np.concatenate([b64, b64], axis=0), rtol=0, atol=0)


def test_silu_back(rng):
    g, x = f32(rng, 3, 5), f32(rng, 3, 5, lo=-4, hi=4)
    got = run1(ggopt.silu_back, g, x)
    x64 = x.astype(np.float64)
    sig = 1 / (1 + np.exp(-x64))
    assert_close(got, g * sig * (1 + x64 * (1 - sig)), rtol=1e-5, atol=1e-7)


def test_add1_gradient_of_b_is_the_sum(rng):
    # ggml takes the mean here; ggopt the true gradient
    prob = GradProblem(ggopt.add1, [f32(rng, 3, 4), np.array([0.5], np.float32)], params=(1,))
    (grad_b,) = prob.analytic()  # loss = sum(add1(a, b) * w): d/db = sum(w)
    np.testing.assert_allclose(grad_b, [prob.arrays[-1].sum()], rtol=1e-6)


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "swiglu": (g.swiglu, [u32(3, 8, lo=-3, hi=3)], (0,)),
    "swiglu_swapped": (g.swiglu_swapped, [u32(3, 8, lo=-3, hi=3)], (0,)),
    "swiglu_split": (g.swiglu_split, [u32(3, 4, lo=-3, hi=3), u32(3, 4, seed=1)], (0, 1)),
    "sin": (g.sin, [u32(3, 5, lo=-4, hi=4)], (0,)),
    "cos": (g.cos, [u32(3, 5, lo=-4, hi=4)], (0,)),
    "add1": (g.add1, [u32(3, 5), u32(1, seed=1)], (0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/pointwise.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.pointwise")
    assert rules and rules - ops == set()
