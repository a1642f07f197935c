"""The rows op family (get_rows and get_rows_back) through graphs: forward values against NumPy (1
and 2 threads, odd sizes, views), every refusal of its constructors (with nothing changed), and
finite-difference gradients of its backward rules (CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import ShapeError
from ggopt import backend as gb
from tests.support.arrays import (
    f32,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, u32
from tests.support.helpers import assert_close, check_grads, run1
from tests.support.state import observable_state


@pytest.mark.usefixtures("n_threads")
def test_get_rows_2d(rng):
    a = f32(rng, 6, 5)
    idx = np.array([3, 0, 5, 3], np.int32)
    out = run1(ggopt.get_rows, a, idx)
    assert_close(out, a[idx])


@pytest.mark.usefixtures("n_threads")
def test_get_rows_4d(rng):
    a = f32(rng, 2, 3, 6, 5)
    idx = rng.integers(0, 6, (2, 3, 4)).astype(np.int32)
    out = run1(ggopt.get_rows, a, idx)
    ref = np.take_along_axis(a, idx[..., None].astype(np.int64), axis=2)
    assert out.shape == (2, 3, 4, 5)
    assert_close(out, ref)


@pytest.mark.usefixtures("n_threads")
def test_get_rows_back(rng):
    g = f32(rng, 7, 5)
    idx = np.array([1, 4, 1, 0, 4, 4, 2], np.int32)
    like = np.zeros((6, 5), np.float32)
    out = run1(ggopt.get_rows_back, g, idx, like)
    ref = np.zeros_like(like)
    np.add.at(ref, idx, g)
    assert out.shape == (6, 5)
    assert_close(out, ref, atol=1e-6)


@pytest.mark.parametrize("bad", [6, -1])
def test_get_rows_index_out_of_range_at_compute(bad):
    ctx, cctx = ggopt.Context(), ggopt.Context()
    a = ctx.new_tensor_2d(ggopt.F32, 5, 6)  # 6 rows
    idx = ctx.new_tensor_1d(ggopt.I32, 3)
    y = ggopt.get_rows(cctx, a, idx)
    ggopt.set_output(y)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.ones((6, 5), np.float32))
    gb.tensor_set(idx, np.array([0, bad, 2], np.int32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    y.numpy()[...] = -5  # the output must not be written
    before = observable_state(ctx, cctx, gf, sched)
    with pytest.raises(ShapeError, match="ggml_get_rows: row index out of range.*6 rows"):
        sched.graph_compute(gf)
    assert observable_state(ctx, cctx, gf, sched) == before
    gb.tensor_set(idx, np.array([0, 5, 2], np.int32))  # fixed indices compute fine
    sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), 1.0)


g = ggopt  # short alias for the case table


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "get_rows": (g.get_rows, [u32(6, 5), np.array([4, 0, 4, 2], np.int32)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/rows.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.rows")
    assert rules and rules - ops == set()
