"""The optim op family (opt_step_adamw and opt_step_sgd) through graphs: forward values against
NumPy (1 and 2 threads, odd sizes, views), every refusal of its constructors (with nothing
changed), and finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import ShapeError
from tests.support.arrays import (
    f32,
)
from tests.support.helpers import assert_close, run
from tests.support.state import assert_unchanged as _unchanged


def _opt_step(build, w, *others):
    """Run one optimizer-step graph; the updated ``[w, *others]`` (updated in place)."""

    def wrapped(c, tw, *ts):
        ggopt.set_param(tw)
        return [build(c, tw, *ts), tw, *ts]

    return run(wrapped, w, *others)[1:]


@pytest.mark.usefixtures("n_threads")
def test_opt_step_adamw(rng):
    w, g = f32(rng, 3, 7), f32(rng, 3, 7)
    m, v = f32(rng, 3, 7, lo=-0.1, hi=0.1), f32(rng, 3, 7, lo=0.0, hi=0.2)
    alpha, b1, b2, eps, wd, t = 1e-2, 0.9, 0.999, 1e-8, 0.1, 3
    prm = np.array([alpha, b1, b2, eps, wd, 1 / (1 - b1 ** t), 1 / (1 - b2 ** t)], np.float32)

    w1, g1, m1, v1, _ = _opt_step(ggopt.opt_step_adamw, w, g, m, v, prm)
    p = prm.astype(np.float64)
    m_ref = m * p[1] + g * (1 - p[1])
    v_ref = v * p[2] + g.astype(np.float64) ** 2 * (1 - p[2])
    w_ref = w * (1 - p[0] * p[4]) - p[0] * (m_ref * p[5]) / (np.sqrt(v_ref * p[6]) + p[3])
    assert_close(m1, m_ref, rtol=1e-5, atol=1e-7)
    assert_close(v1, v_ref, rtol=1e-5, atol=1e-8)
    assert_close(w1, w_ref, rtol=1e-5, atol=1e-6)
    assert_close(g1, g)  # the gradient is read only


@pytest.mark.usefixtures("n_threads")
def test_opt_step_sgd(rng):
    w, g = f32(rng, 301, 129), f32(rng, 301, 129)
    prm = np.array([0.05, 0.2], np.float32)
    w1, g1, _ = _opt_step(ggopt.opt_step_sgd, w, g, prm)
    assert_close(w1, w * (1 - 0.05 * 0.2) - 0.05 * g.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_opt_step_validation(ctx):
    w = ctx.new_tensor_1d(ggopt.F32, 4)
    grad, m, v = (ctx.new_tensor_1d(ggopt.F32, 4) for _ in range(3))
    prm7, prm2 = ctx.new_tensor_1d(ggopt.F32, 7), ctx.new_tensor_1d(ggopt.F32, 2)
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, m, v, prm7), ShapeError,
               "not a parameter")
    ggopt.set_param(w)
    short = ctx.new_tensor_1d(ggopt.F32, 3)
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, short, v, prm7), ShapeError,
               "m .* must have the parameter's shape")
    _unchanged(ctx, lambda: ggopt.opt_step_adamw(ctx, w, grad, m, v, prm2), ShapeError, "7 floats")
    _unchanged(ctx, lambda: ggopt.opt_step_sgd(ctx, w, grad, prm7), ShapeError, "2 floats")
