"""The rope op family (rope, rope_ext and rope_ext_back) through graphs: forward values against
NumPy (1 and 2 threads, odd sizes, views), every refusal of its constructors (with nothing
changed), and finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import DTypeError, InvalidValueError, ShapeError
from tests.support.arrays import f32
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run, run1
from tests.support.state import assert_unchanged as _unchanged
from tests.support.tfm_ref import rope_ref

NORMAL, NEOX = ggopt.ROPE_TYPE_NORMAL, ggopt.ROPE_TYPE_NEOX


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("mode", [NORMAL, NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("n_dims", [8, 4])
@pytest.mark.parametrize("yarn", [False, True], ids=["plain", "yarn"])
def test_rope_ext(rng, mode, n_dims, yarn):
    x = f32(rng, 2, 9, 3, 8)  # [head_dim 8, 3 heads, 9 tokens, 2]
    pos = rng.integers(0, 100, 9).astype(np.int32)
    ff = f32(rng, n_dims // 2, lo=0.5, hi=3.0)
    prm = (48, 1000.0, 0.5, 1.0, 0.9, 32.0, 1.0) if yarn else (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    fwd, back = run(lambda c, t, p, f: [ggopt.rope_ext(c, t, p, f, n_dims, mode, *prm),
                                        ggopt.rope_ext_back(c, t, p, f, n_dims, mode, *prm)],
                    x, pos, ff)
    kw = dict(zip(("n_ctx_orig", "freq_base", "freq_scale", "ext_factor", "attn_factor",
                   "beta_fast", "beta_slow"), prm))
    neox = mode == NEOX
    assert_close(fwd, rope_ref(x, pos, n_dims, neox, 1.0, freq_factors=ff, **kw), 1e-4, 1e-5)
    assert_close(back, rope_ref(x, pos, n_dims, neox, -1.0, freq_factors=ff, **kw), 1e-4, 1e-5)


def test_rope_is_llama_normal_mode(rng):
    # ggopt.rope == rope_ext with ggml_rope's defaults; adjacent pairs rotate by p*10000^(-2i/d)
    x = f32(rng, 4, 2, 6)
    pos = np.array([0, 1, 5, 11], np.int32)
    got = run1(lambda c, t, p: ggopt.rope(c, t, p, 6, NORMAL), x, pos)
    theta = pos[:, None, None] * 10000.0 ** (-np.arange(3) / 3.0)
    x64 = x.astype(np.float64)
    want = np.empty_like(x64)
    want[..., 0::2] = x64[..., 0::2] * np.cos(theta) - x64[..., 1::2] * np.sin(theta)
    want[..., 1::2] = x64[..., 0::2] * np.sin(theta) + x64[..., 1::2] * np.cos(theta)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_rope_validation(ctx):
    a = ctx.new_tensor_3d(ggopt.F32, 8, 2, 5)
    pos, fpos = ctx.new_tensor_1d(ggopt.I32, 5), ctx.new_tensor_1d(ggopt.F32, 5)
    ff = ctx.new_tensor_1d(ggopt.F32, 2)

    def rope_ext(p, c, n_dims, mode):
        return lambda: ggopt.rope_ext(ctx, a, p, c, n_dims, mode, 0, 1e4, 1.0, 0.0, 1.0, 0.0, 0.0)

    _unchanged(ctx, rope_ext(fpos, None, 8, NORMAL), DTypeError, "positions.*must be I32")
    _unchanged(ctx, rope_ext(pos, None, 7, NORMAL), ShapeError, "n_dims must be even")
    _unchanged(ctx, rope_ext(pos, None, 10, NORMAL), ShapeError, "n_dims must be even")
    _unchanged(ctx, rope_ext(pos, None, 8, 1), InvalidValueError, "mode")
    _unchanged(ctx, rope_ext(ctx.new_tensor_1d(ggopt.I32, 4), None, 8, NORMAL), ShapeError,
               "one per token")
    _unchanged(ctx, rope_ext(pos, ff, 8, NEOX), ShapeError, "frequency factors")
    _unchanged(ctx, rope_ext(pos, pos, 4, NEOX), DTypeError, "frequency factors.*F32")
    _unchanged(ctx, lambda: ggopt.rope(ctx, a, pos, 8.0, NORMAL), DTypeError, "n_dims")


g = ggopt  # short alias for the case table


#: positions of three tokens, and a causal mask of 4 rows (one spare) over 5 columns
POS3 = np.array([0, 7, 2], np.int32)


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "rope_normal_partial": (lambda c, a, p: g.rope(c, a, p, 4, g.ROPE_TYPE_NORMAL),
                            [u32(3, 2, 6), POS3], (0,)),
    "rope_ext_neox_yarn": (lambda c, a, p, ff: g.rope_ext(c, a, p, ff, 6, g.ROPE_TYPE_NEOX, 32,
                                                          500.0, 0.5, 1.0, 0.8, 32.0, 1.0),
                           [u32(3, 2, 6), POS3, u32(3, lo=0.5, hi=2.0, seed=3)], (0,)),
    "rope_ext_back": (lambda c, a, p: g.rope_ext_back(c, a, p, None, 6, g.ROPE_TYPE_NORMAL, 0,
                                                      100.0, 1.0, 0.0, 1.0, 0.0, 0.0),
                      [u32(3, 2, 6), POS3], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/rope.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.rope")
    assert rules and rules - ops == set()
