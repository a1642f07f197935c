"""The norm op family (rms_norm and norm) through graphs: forward values against NumPy (1 and 2
threads, odd sizes, views), every refusal of its constructors (with nothing changed), and
finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from tests.support.arrays import f32
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run, run1


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 130, 257)])
def test_rms_norm_and_norm(rng, shape):
    x = f32(rng, *shape) + np.float32(0.3)
    x64 = x.astype(np.float64)
    rms, nrm = run(lambda c, t: [ggopt.rms_norm(c, t, 1e-6), ggopt.norm(c, t, 1e-5)], x)
    assert_close(rms, x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)
    cen = x64 - x64.mean(-1, keepdims=True)
    assert_close(nrm, cen / np.sqrt((cen**2).mean(-1, keepdims=True) + 1e-5), rtol=1e-4,
                 atol=1e-5)


def test_norm_of_a_view(rng):
    x = f32(rng, 5, 6)
    got = run1(lambda c, t: ggopt.rms_norm(c, ggopt.transpose(c, t), 1e-5), x)
    xt = x.T.astype(np.float64)
    assert_close(got, xt / np.sqrt((xt**2).mean(-1, keepdims=True) + 1e-5), rtol=1e-5)


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "rms_norm": (lambda c, a: g.rms_norm(c, a, 1e-5), [u32(2, 3, 6)], (0,)),
    "norm": (lambda c, a: g.norm(c, a, 1e-5), [u32(2, 3, 6)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/norm.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.norm")
    assert rules and rules - ops == set()
