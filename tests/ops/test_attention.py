"""The attention op family (diag_mask_inf and diag_mask_zero, and grouped-query attention) through
graphs: forward values against NumPy (1 and 2 threads, odd sizes, views), every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import ShapeError
from tests.support.arrays import f32, transposed
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import GradProblem, assert_close, check_grads, run, run1
from tests.support.tfm_ref import diag_mask_ref

NORMAL, NEOX = ggopt.ROPE_TYPE_NORMAL, ggopt.ROPE_TYPE_NEOX


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("n_past", [0, 3])
def test_diag_masks(rng, n_past):
    x = f32(rng, 2, 5, 9)
    inf, zero = run(lambda c, t: [ggopt.diag_mask_inf(c, t, n_past),
                                  ggopt.diag_mask_zero(c, transposed(c, t), n_past)], x)
    np.testing.assert_array_equal(inf, diag_mask_ref(x, n_past, -np.inf).astype(np.float32))
    np.testing.assert_array_equal(zero, diag_mask_ref(x, n_past, 0.0).astype(np.float32))


@pytest.mark.usefixtures("n_threads")
def test_grouped_query_attention_is_one_mul_mat(rng):
    # 6 query heads over 2 KV heads: query head h uses KV head h // 3 (ggml's dim-2 broadcast)
    k, q = f32(rng, 2, 5, 4), f32(rng, 6, 7, 4)  # [d, n_kv, n_head_kv], [d, n_tok, n_head]
    kq = run1(ggopt.mul_mat, k, q)
    want = np.stack([q[h] @ k[h // 3].T for h in range(6)])
    assert_close(kq, want, rtol=1e-5, atol=1e-6)


def test_mask_and_freq_factors_get_no_gradient(rng):
    def masked(c, a, m):
        return ggopt.soft_max_ext(c, a, m, 1.0, 0.0)

    with pytest.raises(ShapeError, match="mask gets no gradient"):
        GradProblem(masked, [f32(rng, 3, 4), f32(rng, 3, 4)], params=(0, 1))

    def roped(c, a, p, f):
        return ggopt.rope_ext(c, a, p, f, 4, NORMAL, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)

    with pytest.raises(ShapeError, match="frequency factors get no gradient"):
        GradProblem(roped, [f32(rng, 2, 1, 4), np.arange(2, dtype=np.int32), f32(rng, 2)],
                    params=(0, 2))


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "diag_mask_inf": (lambda c, a: g.soft_max(c, g.diag_mask_inf(c, a, 1)), [u32(2, 3, 5)],
                      (0,)),
    "diag_mask_zero": (lambda c, a: g.diag_mask_zero(c, a, 0), [u32(2, 4, 5)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/attention.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.attention")
    assert rules and rules - ops == set()
