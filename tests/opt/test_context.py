"""The optimization context's state machine: losses, properties, resets, the deliberate
differences from ggml (ggml-opt-spec Q2, Q4, Q6) and memory planning once per graph switch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data

OPTIMIZERS = [opt.OptimizerType.ADAMW, opt.OptimizerType.SGD]


def _step(cd, backward, x=0.0, result=None):
    cd.opt_ctx.alloc(backward)
    cd.set_inputs(x)
    cd.opt_ctx.eval(result)


def test_properties_sum():
    cd = make_ctx_data(opt.OptimizerType.SGD)
    ctx = cd.opt_ctx
    assert ctx.static_graphs is True
    assert ctx.optimizer_type is opt.OptimizerType.SGD
    assert ctx.loss_type is opt.LossType.SUM and ctx.build_type is opt.BuildType.OPT
    assert ctx.inputs is cd.inputs and ctx.outputs is cd.outputs
    assert ctx.labels is None and ctx.pred is None and ctx.ncorrect is None
    assert ctx.loss.type is ggopt.F32 and ctx.loss.ne == (1, 1, 1, 1)
    assert ctx.loss.flags & ggopt.TensorFlag.LOSS and ctx.loss.flags & ggopt.TensorFlag.OUTPUT
    assert cd.inputs.flags & ggopt.TensorFlag.INPUT and cd.outputs.flags & ggopt.TensorFlag.OUTPUT
    assert "sgd" in repr(ctx) and "static" in repr(ctx)


def _ce_model(opt_period=1, loss_type=opt.LossType.CROSS_ENTROPY, optimizer=opt.OptimizerType.SGD):
    """logits = inputs + bias, 3 classes, 4 datapoints per batch."""
    backend = gb.cpu_init()
    sched = gb.Scheduler([backend])
    ctx_static = ggopt.Context()
    inputs = ggopt.set_name(ctx_static.new_tensor_2d(ggopt.F32, 3, 4), "inputs")
    bias = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 3), "bias")
    ggopt.set_param(bias)
    gb.alloc_ctx_tensors(ctx_static, backend)
    bias.numpy()[:] = [0.1, -0.2, 0.3]
    ctx_compute = ggopt.Context()
    logits = ggopt.add(ctx_compute, inputs, bias)
    params = opt.default_params(sched, loss_type)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, logits
    params.opt_period = opt_period
    params.optimizer = optimizer
    return opt.OptContext(params), inputs, bias


X = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [2.0, 2.0, 1.0], [0.2, 0.1, 0.0]], np.float32)
Y = np.eye(3, dtype=np.float32)[[1, 2, 0, 0]]


def _log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("opt_period", [1, 3])
def test_cross_entropy_loss_pred_and_accuracy(opt_period):
    ctx, inputs, bias = _ce_model(opt_period)
    assert ctx.labels.ne == ctx.outputs.ne and ctx.labels.flags & ggopt.TensorFlag.INPUT
    assert ctx.pred.type is ggopt.I32 and ctx.pred.ne[0] == 4
    assert ctx.ncorrect.type is ggopt.I64
    result = opt.Result()
    ctx.alloc(False)
    gb.tensor_set(inputs, X)
    gb.tensor_set(ctx.labels, Y)
    ctx.eval(result)
    logits = X + bias.numpy()
    expected = float(-(Y * _log_softmax(logits.astype(np.float64))).sum(axis=1).mean())
    loss, unc = result.loss()
    assert loss == pytest.approx(expected, rel=1e-6)  # the 1/opt_period scaling is undone
    assert math.isnan(unc)
    assert logits[3, 0] == logits[3, 2]  # a tie: ggml's argmax picks the last maximum
    pred = 2 - np.argmax(logits[:, ::-1], axis=1)
    assert pred.tolist() == [1, 2, 0, 2]
    np.testing.assert_array_equal(result.pred(), pred)
    ncorrect = int((pred == Y.argmax(axis=1)).sum())
    acc, acc_unc = result.accuracy()
    assert acc == ncorrect / 4
    assert acc_unc == pytest.approx(math.sqrt(acc * (1 - acc) / 3))


@pytest.mark.parametrize("opt_period", [1, 2])
def test_mean_squared_error_loss(opt_period):
    ctx, inputs, bias = _ce_model(opt_period, opt.LossType.MEAN_SQUARED_ERROR)
    assert ctx.pred is None and ctx.labels is not None
    result = opt.Result()
    ctx.alloc(False)
    gb.tensor_set(inputs, X)
    gb.tensor_set(ctx.labels, Y)
    ctx.eval(result)
    expected = float(((X + bias.numpy() - Y).astype(np.float64) ** 2).mean())
    assert result.loss()[0] == pytest.approx(expected, rel=1e-6)
    assert math.isnan(result.accuracy()[0])


def test_mean_loss_and_its_gradient():
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False, nbatch_logical=4,
                       nbatch_physical=2, loss_type=opt.LossType.MEAN)
    cd.opt_ctx.alloc(True)
    cd.set_inputs(1.0, 4.0)
    cd.opt_ctx.eval(cd.result)
    # loss = (1+3 + 4+3) / (opt_period*2), stored scaled and reported per datapoint
    assert float(gb.tensor_get(cd.opt_ctx.loss)[0]) == pytest.approx(11 / 4)
    assert cd.result.loss()[0] == pytest.approx(11 / 2)
    assert cd.grad_acc() == pytest.approx(0.5)  # 2 elements * 1/(opt_period*2)


def test_forward_eval_does_not_advance_period():
    # ggml-opt-spec Q2, deliberate difference. ggml gives weights 3,3,3,0,0 and accumulators
    # 1,1,2,3,1.
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False, nbatch_logical=2)
    weights, accs = [], []
    for backward in (True, False, True, True, True):
        _step(cd, backward)
        weights.append(cd.w)
        accs.append(cd.grad_acc())
    assert weights == [3.0, 3.0, 1.0, 1.0, -1.0]
    assert accs == [1.0, 1.0, 2.0, 1.0, 2.0]


def test_accumulators_reset_at_first_alloc_of_new_period_even_if_forward():
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False, nbatch_logical=2)
    _step(cd, True)
    _step(cd, True)
    assert cd.grad_acc() == 2.0  # still readable after the optimizer step
    cd.opt_ctx.alloc(False)
    assert cd.grad_acc() == 0.0
    cd.opt_ctx.eval()


@pytest.mark.parametrize("opt_period", [1, 2])
def test_grad_build_type_computes_gradients_only(opt_period):
    # ggml-opt-spec Q4, deliberate difference: ggml aborts on BuildType.GRAD.
    cd = make_ctx_data(opt.OptimizerType.ADAMW, nbatch_logical=opt_period,
                       build_type=opt.BuildType.GRAD)
    assert cd.opt_ctx.build_type is opt.BuildType.GRAD
    accs = []
    for _ in range(4):
        _step(cd, True, result=cd.result)
        accs.append(cd.grad_acc())
    assert cd.w == 3.0
    assert accs == ([1.0, 1.0, 1.0, 1.0] if opt_period == 1 else [1.0, 2.0, 1.0, 2.0])
    assert cd.result.loss()[0] == 12.0
    cd.opt_ctx.reset(False)
    assert cd.grad_acc() == 0.0


def test_forward_build_type():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, build_type=opt.BuildType.FORWARD)
    for x in range(3):
        _step(cd, False, x, cd.result)
    assert cd.result.loss()[0] == 3 + 4 + 5
    cd.opt_ctx.reset(True)  # nothing to reset
    assert cd.w == 3.0


def test_grad_acc_none_without_accumulator():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    assert cd.opt_ctx.grad_acc(cd.weights) is None  # static, OPT, opt_period 1
    loss_acc = cd.opt_ctx.grad_acc(cd.opt_ctx.loss)
    assert float(gb.tensor_get(loss_acc)[0]) == 1.0
    assert cd.opt_ctx.grad_acc(cd.inputs) is None


def test_get_opt_pars_called_once_per_optimizer_step():
    calls = []

    def pars(ud):
        calls.append(ud)
        return get_test_opt_pars()

    cd = make_ctx_data(opt.OptimizerType.SGD, nbatch_logical=3, init_opt_ctx=False)
    cd.params.get_opt_pars, cd.params.get_opt_pars_ud = pars, "ud"
    cd.opt_ctx = opt.OptContext(cd.params)
    for backward in (True, True, False, True, True, True, True, False):
        _step(cd, backward)
    assert calls == ["ud", "ud"]
    assert cd.w == 3.0 - 3.0 - 3.0


def _adamw_reference(w, grads, p):
    w = np.float32(w)
    m = v = np.float32(0)
    f = np.float32
    for t, g in enumerate(grads, start=1):
        g = f(g)
        b1h = f(1) / (f(1) - f(p.beta1) ** f(t))
        b2h = f(1) / (f(1) - f(p.beta2) ** f(t))
        keep = f(1) - f(p.alpha) * f(p.wd)
        m = m * f(p.beta1) + g * (f(1) - f(p.beta1))
        v = v * f(p.beta2) + g * g * (f(1) - f(p.beta2))
        w = w * keep - f(p.alpha) * (m * b1h) / (np.sqrt(v * b2h) + f(p.eps))
    return w


def test_adamw_matches_reference_with_bias_correction():
    pars = opt.OptimizerParams()
    pars.adamw.alpha, pars.adamw.wd = 0.01, 0.1
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    cd.params.get_opt_pars = opt.get_constant_optimizer_params
    cd.params.get_opt_pars_ud = pars
    cd.opt_ctx = opt.OptContext(cd.params)
    for _ in range(5):
        _step(cd, True)
    expected = _adamw_reference(3.0, [1.0] * 5, pars.adamw)
    assert cd.w == pytest.approx(float(expected), rel=1e-6)


def test_reset_optimizer_restarts_adamw():
    # MSE gives gradients that change with the weights, so AdamW's moments matter.
    def one_step(ctx, inputs):
        ctx.alloc(True)
        gb.tensor_set(inputs, X)
        gb.tensor_set(ctx.labels, Y)
        ctx.eval()

    mse, adamw = opt.LossType.MEAN_SQUARED_ERROR, opt.OptimizerType.ADAMW
    ctx, inputs, bias = _ce_model(1, mse, adamw)
    b0 = bias.numpy().copy()
    one_step(ctx, inputs)
    b1 = bias.numpy().copy()

    ctx, inputs, bias = _ce_model(1, mse, adamw)
    for _ in range(3):
        one_step(ctx, inputs)
    bias.numpy()[:] = b0
    ctx.reset(False)  # moments and step count survive
    one_step(ctx, inputs)
    assert not np.array_equal(bias.numpy(), b1)
    bias.numpy()[:] = b0
    ctx.reset(True)
    one_step(ctx, inputs)
    np.testing.assert_array_equal(bias.numpy(), b1)


def test_memory_planned_once_per_graph_switch():
    cd = make_ctx_data(opt.OptimizerType.SGD, optimizer_defaults=False)
    sched = cd.sched
    calls = []
    alloc_graph = sched.alloc_graph
    sched.alloc_graph = lambda g: calls.append(g) or alloc_graph(g)
    for _ in range(5):
        _step(cd, True)
    assert len(calls) == 1
    _step(cd, False)
    _step(cd, False)
    _step(cd, True)
    assert len(calls) == 3
    assert calls[0] is calls[2] and calls[1] is not calls[0]


def test_close_and_context_manager():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    with opt.OptContext(cd.params) as ctx:
        ctx.alloc(False)
        ctx.eval(None)
    ctx.close()
    for call in (lambda: ctx.alloc(False), lambda: ctx.eval(None), lambda: ctx.reset(True),
                 lambda: ctx.grad_acc(cd.weights)):
        with pytest.raises(ggopt.StateError, match="closed"):
            call()


class _Interrupting:
    """get_opt_pars that raises KeyboardInterrupt on its first call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ud):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt
        return get_test_opt_pars(ud)


def test_interrupted_epoch_leaves_the_context_usable():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    cd.params.get_opt_pars = _Interrupting()
    ctx = opt.OptContext(cd.params)
    with pytest.raises(KeyboardInterrupt):
        opt.epoch(ctx, cd.dataset_unsupervised, None, None, -1)
    assert cd.w == 3.0  # no step was taken
    result = opt.Result()
    opt.epoch(ctx, cd.dataset_unsupervised, result, None, -1)
    assert result.ndata == 6 and cd.w == 3.0 - 6.0


def test_reset_then_alloc_after_an_interrupted_eval():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = _Interrupting()
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    with pytest.raises(KeyboardInterrupt):
        ctx.eval()
    ctx.reset(True)
    ctx.alloc(True)
    ctx.eval()
    assert cd.w == 2.0


def test_reset_keeps_an_alloc_whose_eval_was_not_tried():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = get_test_opt_pars
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    ctx.reset(False)  # as in ggml: the alloc stands
    ctx.eval()
    assert cd.w == 2.0
