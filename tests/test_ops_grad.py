"""Finite-difference checks of the backward rule of every differentiable op, and of gradient
accumulators.

Each case builds ``loss = sum(op(params...) * w)`` with random ``w`` (or a cross-entropy loss),
takes the analytic gradient from build_backward_expand and compares it with central
differences in float32. Inputs stay away from kinks (relu/abs at 0, max-pool ties).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import GradProblem, check_grads, new_tensor

import ggopt
from ggopt import backend as gbe
from ggopt.ops import BACKWARD
from ggopt.tensor import Op, UnaryOp


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> np.ndarray:
    return _rng(seed).uniform(lo, hi, shape).astype(np.float32)


def away(*shape: int, seed: int = 0) -> np.ndarray:
    """Values with ``0.5 <= |x| <= 2``: far from the kinks at 0."""
    r = _rng(seed)
    return (r.uniform(0.5, 2.0, shape) * r.choice([-1.0, 1.0], shape)).astype(np.float32)


def distinct(*shape: int, seed: int = 0) -> np.ndarray:
    """A permutation of a 0.1-spaced grid: no max-pool ties, even after a 1e-2 step."""
    n = int(np.prod(shape))
    return (_rng(seed).permutation(n).reshape(shape) * 0.1 - 0.05 * n).astype(np.float32)


def probs(*shape: int, seed: int = 0) -> np.ndarray:
    e = np.exp(f32(*shape, seed=seed))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


g = ggopt  # short alias for the case table

#: positions of three tokens, and a causal mask of 4 rows (one spare) over 5 columns
POS3 = np.array([0, 7, 2], np.int32)
CAUSAL_4x5 = np.triu(np.full((4, 5), -np.inf, np.float32), 2)

# name -> (build(ctx, *tensors), arrays, indices of the parameters)
CASES = {
    # element-wise binary ops, with ggml tiling of b
    "add": (g.add, [f32(3, 5), f32(3, 5, seed=1)], (0, 1)),
    "add_bias_broadcast": (g.add, [f32(4, 5), f32(1, 5, seed=1)], (0, 1)),
    "add_tile": (g.add, [f32(4, 6), f32(2, 3, seed=1)], (0, 1)),
    "sub": (g.sub, [f32(3, 5), f32(3, 5, seed=1)], (0, 1)),
    "sub_broadcast": (g.sub, [f32(2, 3, 5), f32(1, 3, 5, seed=1)], (0, 1)),
    "mul": (g.mul, [f32(3, 5), f32(3, 5, seed=1)], (0, 1)),
    "mul_broadcast": (g.mul, [f32(3, 5), f32(3, 1, seed=1)], (0, 1)),
    "div": (g.div, [f32(3, 5), away(3, 5, seed=1)], (0, 1)),
    "div_broadcast": (g.div, [f32(2, 3, 4), away(1, 3, 1, seed=1)], (0, 1)),
    # scale and unary ops
    "scale": (lambda c, a: g.scale(c, a, -1.7), [f32(3, 5)], (0,)),
    "sqr": (g.sqr, [f32(3, 5)], (0,)),
    "sqrt": (g.sqrt, [f32(3, 5, lo=0.5, hi=3.0)], (0,)),
    "log": (g.log, [f32(3, 5, lo=0.5, hi=3.0)], (0,)),
    "neg": (g.neg, [f32(3, 5)], (0,)),
    "exp": (g.exp, [f32(3, 5)], (0,)),
    "abs": (g.abs, [away(3, 5)], (0,)),
    "relu": (g.relu, [away(3, 5)], (0,)),
    "gelu": (g.gelu, [f32(3, 5, lo=-3, hi=3)], (0,)),
    "silu": (g.silu, [f32(3, 5, lo=-4, hi=4)], (0,)),
    "tanh": (g.tanh, [f32(3, 5)], (0,)),
    "sigmoid": (g.sigmoid, [f32(3, 5, lo=-4, hi=4)], (0,)),
    # reductions and tiling
    "sum": (g.sum, [f32(3, 5)], (0,)),
    "sum_rows": (g.sum_rows, [f32(2, 3, 5)], (0,)),
    "mean": (g.mean, [f32(2, 3, 5)], (0,)),
    "repeat": (g.repeat, [f32(1, 3), np.zeros((4, 6), np.float32)], (0,)),
    "repeat_back": (g.repeat_back, [f32(4, 6), np.zeros((2, 3), np.float32)], (0,)),
    "acc": (lambda c, a, b: g.acc(c, a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 8),
            [f32(4, 6), f32(2, 3, seed=1)], (0, 1)),
    # softmax and losses
    "soft_max": (g.soft_max, [f32(3, 7)], (0,)),
    "soft_max_ext": (lambda c, a: g.soft_max_ext(c, a, None, 0.7, 0.0), [f32(2, 2, 5)], (0,)),
    "cross_entropy_loss": (g.cross_entropy_loss, [f32(6, 5, lo=-3, hi=3), probs(6, 5, seed=1)],
                           (0,)),
    # matrix products
    "mul_mat": (g.mul_mat, [f32(4, 5), f32(3, 5, seed=1)], (0, 1)),
    "mul_mat_vector": (g.mul_mat, [f32(4, 5), f32(1, 5, seed=1)], (0, 1)),
    "mul_mat_3d": (g.mul_mat, [f32(2, 4, 5), f32(2, 3, 5, seed=1)], (0, 1)),
    "mul_mat_broadcast_a2_1": (g.mul_mat, [f32(1, 1, 3, 4), f32(2, 3, 2, 4, seed=1)], (0, 1)),
    "mul_mat_broadcast": (g.mul_mat, [f32(1, 2, 3, 4), f32(2, 4, 2, 4, seed=1)], (0, 1)),
    "mul_mat_broadcast_dim3": (g.mul_mat, [f32(2, 1, 3, 4), f32(4, 1, 2, 4, seed=1)], (0, 1)),
    "mul_mat_transposed_b": (lambda c, a, b: g.mul_mat(c, a, g.transpose(c, b)),
                             [f32(4, 5), f32(5, 3, seed=1)], (0, 1)),
    "out_prod": (g.out_prod, [f32(5, 4), f32(5, 3, seed=1)], (0, 1)),
    "out_prod_broadcast": (g.out_prod, [f32(1, 2, 5, 4), f32(2, 4, 5, 3, seed=1)], (0, 1)),
    # rows
    "get_rows": (g.get_rows, [f32(6, 5), np.array([4, 0, 4, 2], np.int32)], (0,)),
    # convolution and pooling
    "im2col": (lambda c, x, k: g.im2col(c, k, x, 2, 1, 1, 0, 1, 2, True, g.F32),
               [f32(1, 2, 5, 6), f32(3, 2, 3, 3, seed=1)], (0,)),
    "conv_2d": (lambda c, x, k: g.conv_2d(c, k, x, 2, 1, 1, 1, 1, 1),
                [f32(2, 2, 4, 5), f32(3, 2, 3, 3, seed=1)], (0, 1)),
    # the direct convolution's row blocks (width stride 1) and position blocks
    "conv_2d_direct_rows": (lambda c, x, k: g.conv_2d_direct(c, k, x, 1, 2, 1, 2, 2, 1),
                            [f32(2, 2, 6, 7), f32(3, 2, 3, 2, seed=1)], (0, 1)),
    "conv_2d_direct_positions": (lambda c, x, k: g.conv_2d_direct(c, k, x, 3, 1, 2, 0, 1, 2),
                                 [f32(1, 3, 7, 6), f32(2, 3, 2, 3, seed=1)], (0, 1)),
    "pool_2d_max": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_MAX, 2, 2, 2, 2, 0, 0),
                    [distinct(1, 2, 6, 7)], (0,)),
    "pool_2d_max_overlap_pad": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_MAX, 3, 3, 2, 1, 1, 1),
                                [distinct(1, 2, 5, 6)], (0,)),
    "pool_2d_avg": (lambda c, x: g.pool_2d(c, x, g.OP_POOL_AVG, 3, 2, 2, 1, 1, 0),
                    [f32(1, 2, 5, 6)], (0,)),
    # views, reshapes, permutes and copies
    "view_1d": (lambda c, a: g.view_1d(c, a, 7, 12), [f32(3, 5)], (0,)),
    "view_2d": (lambda c, a: g.view_2d(c, a, 3, 2, a.nb[1], 8), [f32(3, 5)], (0,)),
    "view_3d": (lambda c, a: g.view_3d(c, a, 2, 2, 2, a.nb[1], a.nb[2], a.nb[1] + 4),
                [f32(3, 3, 4)], (0,)),
    "view_4d": (lambda c, a: g.view_4d(c, a, 2, 2, 1, 2, 2 * a.nb[1], a.nb[2], a.nb[2], 4),
                [f32(2, 4, 5)], (0,)),
    "reshape_1d": (lambda c, a: g.reshape_1d(c, a, 15), [f32(3, 5)], (0,)),
    "reshape_2d": (lambda c, a: g.reshape_2d(c, a, 6, 5), [f32(2, 3, 5)], (0,)),
    "reshape_3d": (lambda c, a: g.reshape_3d(c, a, 5, 3, 2), [f32(6, 5)], (0,)),
    "reshape_4d": (lambda c, a: g.reshape_4d(c, a, 2, 3, 1, 5), [f32(6, 5)], (0,)),
    "reshape": (g.reshape, [f32(6, 5), np.zeros((3, 10), np.float32)], (0,)),
    "permute": (lambda c, a: g.permute(c, a, 2, 0, 3, 1), [f32(2, 3, 2, 4)], (0,)),
    "transpose": (g.transpose, [f32(3, 5)], (0,)),
    "cont": (lambda c, a: g.cont(c, g.permute(c, a, 1, 2, 0, 3)), [f32(2, 3, 4)], (0,)),
    "dup": (lambda c, a: g.dup(c, g.transpose(c, a)), [f32(3, 5)], (0,)),
    "cpy": (lambda c, a, b: g.cpy(c, g.transpose(c, a), b),
            [f32(3, 5), np.zeros(15, np.float32)], (0,)),
    # transformer ops
    "rms_norm": (lambda c, a: g.rms_norm(c, a, 1e-5), [f32(2, 3, 6)], (0,)),
    "norm": (lambda c, a: g.norm(c, a, 1e-5), [f32(2, 3, 6)], (0,)),
    "diag_mask_inf": (lambda c, a: g.soft_max(c, g.diag_mask_inf(c, a, 1)), [f32(2, 3, 5)],
                      (0,)),
    "diag_mask_zero": (lambda c, a: g.diag_mask_zero(c, a, 0), [f32(2, 4, 5)], (0,)),
    "soft_max_ext_mask_alibi": (lambda c, a, m: g.soft_max_ext(c, a, m, 0.6, 4.0),
                                [f32(1, 4, 3, 5), CAUSAL_4x5], (0,)),
    "soft_max_ext_mask_tiled": (lambda c, a, m: g.soft_max_ext(c, a, m, 1.3, 0.0),
                                [f32(2, 4, 3, 5), f32(1, 2, 4, 5, seed=2)], (0,)),
    "rope_normal_partial": (lambda c, a, p: g.rope(c, a, p, 4, g.ROPE_TYPE_NORMAL),
                            [f32(3, 2, 6), POS3], (0,)),
    "rope_ext_neox_yarn": (lambda c, a, p, ff: g.rope_ext(c, a, p, ff, 6, g.ROPE_TYPE_NEOX, 32,
                                                          500.0, 0.5, 1.0, 0.8, 32.0, 1.0),
                           [f32(3, 2, 6), POS3, f32(3, lo=0.5, hi=2.0, seed=3)], (0,)),
    "rope_ext_back": (lambda c, a, p: g.rope_ext_back(c, a, p, None, 6, g.ROPE_TYPE_NORMAL, 0,
                                                      100.0, 1.0, 0.0, 1.0, 0.0, 0.0),
                      [f32(3, 2, 6), POS3], (0,)),
    "swiglu": (g.swiglu, [f32(3, 8, lo=-3, hi=3)], (0,)),
    "swiglu_swapped": (g.swiglu_swapped, [f32(3, 8, lo=-3, hi=3)], (0,)),
    "swiglu_split": (g.swiglu_split, [f32(3, 4, lo=-3, hi=3), f32(3, 4, seed=1)], (0, 1)),
    "sin": (g.sin, [f32(3, 5, lo=-4, hi=4)], (0,)),
    "cos": (g.cos, [f32(3, 5, lo=-4, hi=4)], (0,)),
    "add1": (g.add1, [f32(3, 5), f32(1, seed=1)], (0, 1)),
    "concat_dim0": (lambda c, a, b: g.concat(c, a, b, 0), [f32(2, 3, 4), f32(2, 3, 2, seed=1)],
                    (0, 1)),
    "concat_dim2": (lambda c, a, b: g.concat(c, a, b, 2), [f32(1, 3, 4), f32(2, 3, 4, seed=1)],
                    (0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_gradient(name):
    build, arrays, params = CASES[name]
    check_grads(build, *arrays, params=params)


def test_cross_entropy_loss_unweighted():
    # the natural use: the loss itself, one-hot labels
    x = f32(7, 4, lo=-3, hi=3)
    y = np.eye(4, dtype=np.float32)[[0, 3, 1, 1, 2, 0, 3]]
    check_grads(g.cross_entropy_loss, x, y, weighted=False)


def test_cases_cover_every_backward_rule():
    """Every op with a backward rule (and every unary function but step) has a case above."""
    ops, uops = set(), set()
    for build, arrays, _ in CASES.values():
        ctx = ggopt.Context()
        out = build(ctx, *[new_tensor(ctx, a) for a in arrays])
        gf = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(gf, out)
        for n in gf.nodes:
            ops.add(n.op)
            if n.op is Op.UNARY:
                uops.add(n.op_params)
    assert set(BACKWARD) - ops == set()
    assert set(UnaryOp) - uops == {UnaryOp.STEP}


# --- composite graphs -------------------------------------------------------------------


def test_tensor_used_twice():
    # a reaches the loss three ways: both operands of mul, and directly
    check_grads(lambda c, a: g.add(c, g.mul(c, a, a), a), f32(3, 4))


def test_tensor_used_as_both_mul_mat_operands():
    check_grads(lambda c, a: g.mul_mat(c, a, a), f32(3, 4))


def test_views_and_permutes_of_one_parameter():
    def build(c, a):
        # a [4,3,2]: its permute, a view of its first plane, a reshape of its second plane
        p = g.cont(c, g.permute(c, a, 1, 0, 2, 3))                       # [3,4,2]
        v = g.view_2d(c, a, 4, 3, a.nb[1], 0)                            # plane 0: [4,3]
        r = g.reshape_2d(c, g.view_1d(c, a, 12, a.nb[2]), 3, 4)          # plane 1 as [3,4]
        s = g.add(c, g.sqr(c, r), g.cont(c, g.transpose(c, v)))          # [3,4]
        return g.mul(c, p, s)                                            # s tiles over dim 2

    check_grads(build, f32(2, 3, 4))


def test_mlp_bias_relu_cross_entropy():
    def build(c, w1, b1, w2, b2, x, y):
        h = g.relu(c, g.add(c, g.mul_mat(c, w1, x), b1))
        logits = g.add(c, g.mul_mat(c, w2, h), b2)
        return g.cross_entropy_loss(c, logits, y)

    x = f32(5, 4, seed=5)
    y = np.eye(3, dtype=np.float32)[[0, 2, 1, 2, 0]]
    arrays = [f32(6, 4, seed=1), away(1, 6, seed=2), f32(3, 6, seed=3), f32(1, 3, seed=4), x, y]
    check_grads(build, *arrays, params=(0, 1, 2, 3), weighted=False, eps=1e-3, rtol=2e-2,
                atol=1e-3)


def test_conv_bias_relu_pool_dense():
    """ggml-opt-spec §8.3's CNN in miniature: conv + bias + relu + max-pool, NHWC flatten,
    dense, CE."""

    def build(c, k, kb, dw, db, x, y):
        n = x.ne[3]
        h = g.relu(c, g.add(c, g.conv_2d(c, k, x, 1, 1, 1, 1, 1, 1), kb))     # [4,4,3,N]
        p = g.pool_2d(c, h, g.OP_POOL_MAX, 2, 2, 2, 2, 0, 0)                  # [2,2,3,N]
        d = g.reshape_2d(c, g.cont(c, g.permute(c, p, 1, 2, 0, 3)), 12, n)   # [12,N]
        logits = g.add(c, g.mul_mat(c, dw, d), db)                          # [5,N]
        return g.cross_entropy_loss(c, logits, y)

    x = f32(2, 2, 4, 4, seed=5)
    y = np.eye(5, dtype=np.float32)[[1, 3]]
    arrays = [f32(3, 2, 3, 3, seed=1), f32(3, 1, 1, seed=2, lo=0.2, hi=0.6),
              f32(5, 12, seed=3), f32(1, 5, seed=4), x, y]
    check_grads(build, *arrays, params=(0, 1, 2, 3), weighted=False, eps=1e-3, rtol=2e-2,
                atol=1e-3)


# --- gradient accumulators and graph_reset ----------------------------------------------


def _quadratic():
    """loss = sum((sqr(a) + a * b) * w): grad_a = (2 a + b) w."""
    def build(c, a, b):
        return g.add(c, g.sqr(c, a), g.mul(c, a, b))

    return GradProblem(build, [f32(3, 4), f32(3, 4, seed=1)], params=(0,), accumulate=True)


def test_grad_accumulators_sum_across_computes():
    prob = _quadratic()
    a_t = prob.tensors[0]
    acc = ggopt.graph_get_grad_acc(prob.gb, a_t)
    grad = ggopt.graph_get_grad(prob.gb, a_t)
    assert acc is not None and acc in prob.accs
    assert grad.data_owner() is acc  # the final gradient is summed in place into acc
    a, b, w = prob.arrays
    expected = (2 * a + b) * w

    ggopt.graph_reset(prob.gb)
    np.testing.assert_array_equal(acc.numpy(), 0)
    prob.sched.graph_compute(prob.gb)
    np.testing.assert_allclose(acc.numpy(), expected, rtol=1e-6, atol=1e-6)
    prob.sched.graph_compute(prob.gb)
    np.testing.assert_allclose(acc.numpy(), 2 * expected, rtol=1e-6, atol=1e-6)

    ggopt.graph_reset(prob.gb)
    np.testing.assert_array_equal(acc.numpy(), 0)
    loss_grad = ggopt.graph_get_grad_acc(prob.gb, prob.loss)
    np.testing.assert_array_equal(loss_grad.numpy(), 1.0)
    prob.sched.graph_compute(prob.gb)
    np.testing.assert_allclose(acc.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_graph_reset_sets_loss_gradient_and_clears_adamw_moments():
    ctx = ggopt.Context()
    w = ctx.new_tensor_1d(ggopt.F32, 4)
    ggopt.set_param(w)
    m, v = ctx.new_tensor_1d(ggopt.F32, 4), ctx.new_tensor_1d(ggopt.F32, 4)
    prm = ctx.new_tensor_1d(ggopt.F32, 7)
    cctx = ggopt.Context()
    loss = g.sum(cctx, g.sqr(cctx, w))
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(cctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    gbk = ggopt.graph_dup(cctx, gf)
    ggopt.build_backward_expand(cctx, gbk, None)
    grad = ggopt.graph_get_grad(gbk, w)
    ggopt.build_forward_expand(gbk, g.opt_step_adamw(cctx, w, grad, m, v, prm))
    cpu = gbe.cpu_init()
    gbe.alloc_ctx_tensors(ctx, cpu)
    for t in (w, m, v):
        gbe.tensor_set(t, np.full(4, 3.0, np.float32))
    gbe.tensor_set(prm, np.array([0.1, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0], np.float32))
    sched = gbe.Scheduler([cpu])
    sched.alloc_graph(gbk)
    ggopt.graph_reset(gbk)
    np.testing.assert_array_equal(m.numpy(), 0)
    np.testing.assert_array_equal(v.numpy(), 0)
    np.testing.assert_array_equal(w.numpy(), 3.0)  # parameters are not touched
    np.testing.assert_array_equal(ggopt.graph_get_grad_acc(gbk, loss).numpy(), 1.0)
    sched.graph_compute(gbk)
    # first AdamW step from zero moments moves every weight by alpha (sign of the gradient)
    np.testing.assert_allclose(w.numpy(), 3.0 - 0.1, rtol=1e-5)
