"""Backward graphs of whole models, against finite differences: a tensor used twice, views of one
parameter, an MLP and a CNN; and gradient accumulators across computes and graph resets.
"""

from __future__ import annotations

import numpy as np

import ggopt
from ggopt import backend as gbe
from tests.support.grad_inputs import away, u32
from tests.support.helpers import GradProblem, check_grads

g = ggopt  # short alias for the case table


def test_tensor_used_twice():
    # a reaches the loss three ways: both operands of mul, and directly
    check_grads(lambda c, a: g.add(c, g.mul(c, a, a), a), u32(3, 4))


def test_tensor_used_as_both_mul_mat_operands():
    check_grads(lambda c, a: g.mul_mat(c, a, a), u32(3, 4))


def test_views_and_permutes_of_one_parameter():
    def build(c, a):
        # a [4,3,2]: its permute, a view of its first plane, a reshape of its second plane
        p = g.cont(c, g.permute(c, a, 1, 0, 2, 3))                       # [3,4,2]
        v = g.view_2d(c, a, 4, 3, a.nb[1], 0)                            # plane 0: [4,3]
        r = g.reshape_2d(c, g.view_1d(c, a, 12, a.nb[2]), 3, 4)          # plane 1 as [3,4]
        s = g.add(c, g.sqr(c, r), g.cont(c, g.transpose(c, v)))          # [3,4]
        return g.mul(c, p, s)                                            # s tiles over dim 2

    check_grads(build, u32(2, 3, 4))


def test_mlp_bias_relu_cross_entropy():
    def build(c, w1, b1, w2, b2, x, y):
        h = g.relu(c, g.add(c, g.mul_mat(c, w1, x), b1))
        logits = g.add(c, g.mul_mat(c, w2, h), b2)
        return g.cross_entropy_loss(c, logits, y)

    x = u32(5, 4, seed=5)
    y = np.eye(3, dtype=np.float32)[[0, 2, 1, 2, 0]]
    arrays = [u32(6, 4, seed=1), away(1, 6, seed=2), u32(3, 6, seed=3), u32(1, 3, seed=4), x, y]
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

    x = u32(2, 2, 4, 4, seed=5)
    y = np.eye(5, dtype=np.float32)[[1, 3]]
    arrays = [u32(3, 2, 3, 3, seed=1), u32(3, 1, 1, seed=2, lo=0.2, hi=0.6),
              u32(5, 12, seed=3), u32(1, 5, seed=4), x, y]
    check_grads(build, *arrays, params=(0, 1, 2, 3), weighted=False, eps=1e-3, rtol=2e-2,
                atol=1e-3)


def _quadratic():
    """loss = sum((sqr(a) + a * b) * w): grad_a = (2 a + b) w."""
    def build(c, a, b):
        return g.add(c, g.sqr(c, a), g.mul(c, a, b))

    return GradProblem(build, [u32(3, 4), u32(3, 4, seed=1)], params=(0,), accumulate=True)


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
