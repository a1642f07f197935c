"""Dynamic graphs: rebuilt per batch after prepare_alloc, same weights as static graphs, and
the deliberate fix of ggml's never-zeroed accumulators (ggml-opt-spec Q1)."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data


class Dynamic:
    """The test-opt model with dynamic graphs: a fresh compute context per batch."""

    def __init__(self, optimizer, opt_period=1, loss_type=opt.LossType.SUM, pars=None,
                 nbatch_physical=1):
        self.cd = make_ctx_data(optimizer, init_opt_ctx=False, nbatch_physical=nbatch_physical,
                                nbatch_logical=nbatch_physical, loss_type=loss_type)
        params = opt.default_params(self.cd.sched, loss_type)
        params.opt_period = opt_period
        params.optimizer = optimizer
        if pars is not None:
            params.get_opt_pars = pars
        self.ctx = opt.OptContext(params)

    def prepare(self):
        cd = self.cd
        ctx_compute = ggopt.Context()
        outputs = ggopt.scale(ctx_compute, ggopt.add(ctx_compute, cd.inputs, cd.weights), 1.0)
        gf = ggopt.new_graph_custom(ctx_compute, ggopt.GRAPH_DEFAULT_SIZE, True)
        ggopt.build_forward_expand(gf, outputs)
        self.ctx.prepare_alloc(ctx_compute, gf, cd.inputs, outputs)
        return outputs

    def step(self, backward, *x, result=None):
        self.prepare()
        self.ctx.alloc(backward)
        self.cd.set_inputs(*x)
        self.ctx.eval(result)


def _static_step(cd, backward, *x, result=None):
    cd.opt_ctx.alloc(backward)
    cd.set_inputs(*x)
    cd.opt_ctx.eval(result)


def test_dynamic_context_properties():
    dyn = Dynamic(opt.OptimizerType.SGD)
    assert dyn.ctx.static_graphs is False
    assert dyn.ctx.inputs is None and dyn.ctx.loss is None
    outputs = dyn.prepare()
    dyn.ctx.alloc(True)
    assert dyn.ctx.outputs is outputs and dyn.ctx.loss.flags & ggopt.TensorFlag.LOSS
    dyn.ctx.eval(None)


def test_accumulators_rezeroed_each_period_q1():
    # ggml (measured, ggml-opt-spec Q1): weights 2, 0, -3, -7, -12, -18 because gradients keep
    # summing.
    dyn = Dynamic(opt.OptimizerType.SGD, pars=get_test_opt_pars)
    weights, losses = [], []
    for x in range(6):
        result = opt.Result()
        dyn.step(True, x, result=result)
        weights.append(dyn.cd.w)
        losses.append(result.loss()[0])
    assert weights == [2.0, 1.0, 0.0, -1.0, -2.0, -3.0]
    assert losses == [3.0] * 6


def test_accumulators_rezeroed_each_period_q1_period_2():
    # ggml (measured): 3, 1, 1, -3, -3, -9.
    dyn = Dynamic(opt.OptimizerType.SGD, opt_period=2, pars=get_test_opt_pars)
    weights = []
    for x in range(6):
        dyn.step(True, x)
        weights.append(dyn.cd.w)
    assert weights == [3.0, 1.0, 1.0, -1.0, -1.0, -3.0]


@pytest.mark.parametrize("optimizer", [opt.OptimizerType.ADAMW, opt.OptimizerType.SGD],
                         ids=opt.optimizer_name)
@pytest.mark.parametrize("opt_period", [1, 2, 3])
@pytest.mark.parametrize("loss_type", [opt.LossType.SUM, opt.LossType.MEAN], ids=["sum", "mean"])
def test_dynamic_equals_static(optimizer, opt_period, loss_type):
    pattern = [True, True, False, True, True, True, False, False, True, True, True, True]
    dyn = Dynamic(optimizer, opt_period, loss_type, nbatch_physical=2)
    cd = make_ctx_data(optimizer, nbatch_logical=2 * opt_period, nbatch_physical=2,
                       loss_type=loss_type)
    r_dyn, r_static = opt.Result(), opt.Result()
    rng = np.random.default_rng(0)
    for backward in pattern:
        x = rng.standard_normal(2).astype(np.float32).tolist()
        dyn.step(backward, *x, result=r_dyn)
        _static_step(cd, backward, *x, result=r_static)
        assert dyn.cd.w == cd.w
        if opt_period > 1:
            acc = dyn.ctx.grad_acc(dyn.cd.weights)
            assert gb.tensor_get(acc)[0] == cd.grad_acc()
    assert r_dyn.loss() == r_static.loss()
    assert dyn.cd.w != 3.0


def test_dynamic_reset_and_grad_acc_after_eval():
    # ggml: reset is a no-op and grad_acc crashes once eval has dropped the graphs
    # (ggml-opt-spec Q6).
    dyn = Dynamic(opt.OptimizerType.SGD, opt_period=4, pars=get_test_opt_pars)
    dyn.step(True, 0.0)
    dyn.step(True, 1.0)
    acc = dyn.ctx.grad_acc(dyn.cd.weights)
    assert gb.tensor_get(acc)[0] == 2.0
    dyn.ctx.reset(False)
    assert gb.tensor_get(acc)[0] == 0.0


def test_dynamic_mse_labels_set_after_alloc():
    dyn = Dynamic(opt.OptimizerType.SGD, loss_type=opt.LossType.MEAN_SQUARED_ERROR,
                  nbatch_physical=2)
    result = opt.Result()
    dyn.prepare()
    dyn.ctx.alloc(False)
    assert dyn.ctx.labels is not None and dyn.ctx.labels.ctx is not dyn.cd.ctx_static
    dyn.cd.set_inputs(1.0, 2.0)
    gb.tensor_set(dyn.ctx.labels, np.array([5.0, 4.0], np.float32))
    dyn.ctx.eval(result)
    assert result.loss()[0] == pytest.approx(((4 - 5) ** 2 + (5 - 4) ** 2) / 2)


def test_dynamic_forward_only_context():
    dyn = Dynamic(opt.OptimizerType.ADAMW)
    params = opt.default_params(dyn.cd.sched, opt.LossType.SUM)
    params.build_type = opt.BuildType.FORWARD
    dyn.ctx = opt.OptContext(params)
    result = opt.Result()
    for x in range(3):
        dyn.step(False, x, result=result)
    assert result.loss()[0] == 12.0
    with pytest.raises(ggopt.StateError, match="FORWARD"):
        dyn.ctx.grad_acc(dyn.cd.weights)
