"""The softmax op family (soft_max, soft_max_ext (scale, mask, ALiBi) and its backward,
cross_entropy_loss, cross_entropy_loss_ids) through graphs: forward values against NumPy (1 and
2 threads, odd sizes, views), the ids op against the one-hot op, every refusal of its
constructors (with nothing changed), and finite-difference gradients of its backward rules
(CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import DTypeError, InvalidValueError, ShapeError
from ggopt import backend as gb
from tests.support.arrays import (
    LAYOUTS,
    f32,
    layout_input,
)
from tests.support.grad_inputs import backward_rules_of, case_ops, probs, u32
from tests.support.helpers import GradProblem, assert_close, check_grads, run, run1
from tests.support.sizes import LARGE_CE
from tests.support.state import assert_unchanged as _unchanged
from tests.support.state import observable_state
from tests.support.tfm_ref import soft_max_ext_ref


def softmax_ref(x: np.ndarray, s: float = 1.0) -> np.ndarray:
    z = s * x.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_soft_max(rng, layout):
    x, view, xin = layout_input(rng, layout, -5, 5)
    assert_close(run1(lambda c, t: ggopt.soft_max(c, view(c, t)), x), softmax_ref(xin),
                 rtol=1e-5, atol=1e-7)


@pytest.mark.usefixtures("n_threads")
def test_soft_max_ext_and_large_logits(rng):
    x = f32(rng, 3, 11) + np.float32(500.0)  # exp would overflow without the max shift
    a, b = run(lambda c, t: [ggopt.soft_max(c, t),
                              ggopt.soft_max_ext(c, t, None, 0.5, 0.0)], x)
    assert_close(a, softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert_close(b, softmax_ref(x, 0.5), rtol=1e-5, atol=1e-7)


def ce_ref(x: np.ndarray, y: np.ndarray) -> float:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    y = y.reshape(-1, y.shape[-1]).astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    return float(-(y * lsm).sum() / x.shape[0])


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shape", [(7, 10), (2, 3, 5), (501, 10), LARGE_CE], ids=str)
def test_cross_entropy_loss_and_back(rng, shape):
    x = f32(rng, *shape, lo=-4, hi=4)
    y = softmax_ref(f32(rng, *shape, lo=-3, hi=3)).astype(np.float32)  # soft labels
    g = np.array([0.7], np.float32)

    def build(c, tx, ty, tg):
        return [ggopt.cross_entropy_loss(c, tx, ty), ggopt.cross_entropy_loss_back(c, tg, tx, ty)]

    loss, back = run(build, x, y, g)
    nr = x.size // x.shape[-1]
    assert_close(loss, ce_ref(x, y), rtol=1e-5)
    assert_close(back, (softmax_ref(x) - y) * 0.7 / nr, rtol=1e-4, atol=1e-7)


@pytest.mark.usefixtures("n_threads")
def test_cross_entropy_one_hot_transposed_logits(rng):
    x = f32(rng, 6, 10, lo=-4, hi=4)  # transpose -> ggml [6,10]: 10 rows of 6 classes
    y = np.eye(6, dtype=np.float32)[rng.integers(0, 6, 10)]
    out = run1(lambda c, tx, ty: ggopt.cross_entropy_loss(c, ggopt.transpose(c, tx), ty), x, y)
    assert_close(out, ce_ref(x.T, y), rtol=1e-5)


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("a_shape,m_shape,scale,max_bias", [
    ((1, 4, 3, 5), None, 0.5, 0.0),
    ((1, 4, 3, 5), (1, 1, 4, 5), 0.5, 0.0),      # spare mask rows
    ((2, 4, 3, 5), (2, 2, 3, 5), 1.0, 0.0),      # tiled over heads and dim 3
    ((1, 5, 3, 5), (1, 1, 3, 5), 0.3, 8.0),      # ALiBi, 5 heads (not a power of two)
    ((2, 8, 130, 260), (1, 1, 130, 260), 0.125, 0.0),
])
def test_soft_max_ext(rng, a_shape, m_shape, scale, max_bias):
    a = f32(rng, *a_shape, lo=-5, hi=5)
    if m_shape is None:
        got = run1(lambda c, t: ggopt.soft_max_ext(c, t, None, scale, max_bias), a)
        mask = None
    else:
        mask = f32(rng, *m_shape)
        mask[..., 1::3] = -np.inf
        got = run1(lambda c, t, m: ggopt.soft_max_ext(c, t, m, scale, max_bias), a, mask)
    assert_close(got, soft_max_ext_ref(a, mask, scale, max_bias), rtol=1e-5, atol=1e-7)


def test_soft_max_ext_back(rng):
    g, y = f32(rng, 2, 3, 7), f32(rng, 2, 3, 7, lo=0, hi=1)
    got = run1(lambda c, a, b: ggopt.soft_max_ext_back(c, a, b, 0.4, 0.0), g, y)
    g64, y64 = g.astype(np.float64), y.astype(np.float64)
    assert_close(got, 0.4 * y64 * (g64 - (g64 * y64).sum(-1, keepdims=True)), rtol=1e-5)


def test_soft_max_ext_validation(ctx):
    a = ctx.new_tensor_4d(ggopt.F32, 6, 4, 6, 2)
    imask = ctx.new_tensor_2d(ggopt.I32, 6, 4)

    def sm(m, scale=1.0, max_bias=0.0):
        return lambda: ggopt.soft_max_ext(ctx, a, m, scale, max_bias)

    _unchanged(ctx, sm(imask), DTypeError, "mask must be F32")
    for ne in [(5, 4), (6, 3), (6, 4, 4), (6, 4, 2, 3)]:
        _unchanged(ctx, sm(ctx.new_tensor(ggopt.F32, ne)), ShapeError, "does not broadcast")
    _unchanged(ctx, sm(None, max_bias=1.0), ShapeError, "ALiBi")
    _unchanged(ctx, sm(ctx.new_tensor_2d(ggopt.F32, 6, 4), scale="x"), DTypeError, "scale")
    g = ctx.new_tensor_2d(ggopt.F32, 6, 4)
    _unchanged(ctx, lambda: ggopt.soft_max_ext_back(ctx, g, a, 1.0, 0.0), ShapeError, "one shape")


def test_cross_entropy_loss_shape_mismatch(ctx):
    a, b = ctx.new_tensor_2d(ggopt.F32, 10, 4), ctx.new_tensor_2d(ggopt.F32, 10, 5)
    _unchanged(ctx, lambda: ggopt.cross_entropy_loss(ctx, a, b), ShapeError,
               r"ggml_cross_entropy_loss.*\[10, 4, 1, 1\].*\[10, 5, 1, 1\]")


def _one_hot(ids: np.ndarray, ncls: int) -> np.ndarray:
    y = np.zeros((*ids.shape, ncls), np.float32)
    keep = ids != -100
    y[keep, ids[keep]] = 1.0
    return y


@pytest.mark.usefixtures("n_threads")
@pytest.mark.parametrize("shape", [(7, 10), (2, 3, 5), (33, 301), LARGE_CE], ids=str)
def test_cross_entropy_loss_ids_equals_the_one_hot_op(rng, shape):
    """Loss and gradient bits of the one-hot op's; ignored rows add 0 and get exactly 0."""
    x = f32(rng, *shape, lo=-4, hi=4)
    ids = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    ids.reshape(-1)[::3] = -100
    y = _one_hot(ids, shape[-1])
    gr = np.array([0.7], np.float32)
    loss, back = run(lambda c, tx, ti, tg: [ggopt.cross_entropy_loss_ids(c, tx, ti),
                                            ggopt.cross_entropy_loss_ids_back(c, tg, tx, ti)],
                     x, ids, gr)
    want_loss, want_back = run(lambda c, tx, ty, tg: [
        ggopt.cross_entropy_loss(c, tx, ty), ggopt.cross_entropy_loss_back(c, tg, tx, ty)],
        x, y, gr)
    kept = ids != -100
    np.testing.assert_array_equal(loss.view(np.int32), want_loss.view(np.int32))
    np.testing.assert_array_equal(back[kept].view(np.int32), want_back[kept].view(np.int32))
    np.testing.assert_array_equal(back[~kept].view(np.int32), 0)
    assert_close(loss, ce_ref(x, y), rtol=1e-5)


def test_cross_entropy_loss_ids_gradient_through_a_graph_skips_ignored_rows(rng):
    """The backward rule: the logits' gradient is the ids op's, ignored rows exactly 0."""
    x, ids = f32(rng, 9, 6, lo=-3, hi=3), np.array([0, 5, -100, 2, -100, 1, 1, 3, 4], np.int32)
    prob = GradProblem(g.cross_entropy_loss_ids, [x, ids], weighted=False)
    (grad,) = prob.analytic()
    want = softmax_ref(x) - _one_hot(ids, 6)
    want[ids == -100] = 0
    assert_close(grad, want / 9, rtol=1e-5, atol=1e-8)
    assert (grad[ids == -100] == 0).all()


def test_cross_entropy_loss_ids_validation(ctx):
    a = ctx.new_tensor_3d(ggopt.F32, 10, 4, 3)
    ids = ctx.new_tensor_2d(ggopt.I32, 4, 3)
    f_ids, i_logits = ctx.new_tensor_2d(ggopt.F32, 4, 3), ctx.new_tensor_2d(ggopt.I32, 10, 4)
    wrong = [ctx.new_tensor(ggopt.I32, ne) for ne in [(4,), (3, 4), (4, 3, 2), (10, 4, 3)]]
    empty, ids4 = ctx.new_tensor_2d(ggopt.F32, 0, 4), ctx.new_tensor_1d(ggopt.I32, 4)
    ce = ggopt.cross_entropy_loss_ids
    _unchanged(ctx, lambda: ce(ctx, a, f_ids), DTypeError, "ids must be I32")
    for w in wrong:
        _unchanged(ctx, lambda w=w: ce(ctx, a, w), ShapeError,
                   r"one class id per row, ids of ne \[4, 3, 1, 1\]")
    _unchanged(ctx, lambda: ce(ctx, i_logits, ids), DTypeError, "F32")
    _unchanged(ctx, lambda: ce(ctx, a, ids, 1.5), DTypeError, "ignore_id must be an int")
    _unchanged(ctx, lambda: ce(ctx, a, ids, True), DTypeError, "ignore_id must be an int")
    _unchanged(ctx, lambda: ce(ctx, a, ids, 2**31), InvalidValueError, "int32")
    _unchanged(ctx, lambda: ce(ctx, empty, ids4), ShapeError, "at least one")
    _unchanged(ctx, lambda: ggopt.cross_entropy_loss_ids_back(ctx, a, a, ids), ShapeError,
               "must be a scalar")


@pytest.mark.parametrize("bad", [10, -1])
def test_cross_entropy_loss_ids_out_of_range_at_compute(bad):
    """A bad id raises InvalidValueError before the op writes anything; fixed ids then run."""
    ctx, cctx = ggopt.Context(), ggopt.Context()
    a, ids = ctx.new_tensor_2d(ggopt.F32, 10, 3), ctx.new_tensor_1d(ggopt.I32, 3)
    loss = ggopt.cross_entropy_loss_ids(cctx, a, ids)
    ggopt.set_output(loss)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, loss)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.zeros((3, 10), np.float32))
    gb.tensor_set(ids, np.array([0, bad, -100], np.int32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    loss.numpy()[...] = -5
    before = observable_state(ctx, cctx, gf, sched)
    with pytest.raises(InvalidValueError, match=rf"row 1 is {bad}, out of range.*\[0, 10\)"):
        sched.graph_compute(gf)
    assert observable_state(ctx, cctx, gf, sched) == before
    gb.tensor_set(ids, np.array([0, 9, -100], np.int32))
    sched.graph_compute(gf)
    assert_close(loss.numpy().reshape(-1), [2 * np.log(10) / 3], rtol=1e-6)


g = ggopt  # short alias for the case table


CAUSAL_4x5 = np.triu(np.full((4, 5), -np.inf, np.float32), 2)


def test_cross_entropy_loss_unweighted():
    # the natural use: the loss itself, one-hot labels
    x = u32(7, 4, lo=-3, hi=3)
    y = np.eye(4, dtype=np.float32)[[0, 3, 1, 1, 2, 0, 3]]
    check_grads(g.cross_entropy_loss, x, y, weighted=False)


# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    "soft_max": (g.soft_max, [u32(3, 7)], (0,)),
    "soft_max_ext": (lambda c, a: g.soft_max_ext(c, a, None, 0.7, 0.0), [u32(2, 2, 5)], (0,)),
    "cross_entropy_loss": (g.cross_entropy_loss, [u32(6, 5, lo=-3, hi=3), probs(6, 5, seed=1)],
                           (0,)),
    "cross_entropy_loss_ids": (g.cross_entropy_loss_ids,
                               [u32(6, 5, lo=-3, hi=3), np.array([0, 4, -100, 2, 2, 1], np.int32)],
                               (0,)),
    "soft_max_ext_mask_alibi": (lambda c, a, m: g.soft_max_ext(c, a, m, 0.6, 4.0),
                                [u32(1, 4, 3, 5), CAUSAL_4x5], (0,)),
    "soft_max_ext_mask_tiled": (lambda c, a, m: g.soft_max_ext(c, a, m, 1.3, 0.0),
                                [u32(2, 4, 3, 5), u32(1, 2, 4, 5, seed=2)], (0,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule in ggopt/ops/softmax.py has a case above."""
    ops, _ = case_ops(CASES)
    rules = backward_rules_of("ggopt.ops.softmax")
    assert rules and rules - ops == set()
