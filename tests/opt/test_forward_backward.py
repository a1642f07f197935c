"""ggml test-opt: test_grad and test_forward_backward (ggml-opt-spec §7.3-7.4), AdamW and SGD."""

from __future__ import annotations

import math

import pytest

from ggopt import opt
from tests.support.opt_fixture import make_ctx_data

OPTIMIZERS = [opt.OptimizerType.ADAMW, opt.OptimizerType.SGD]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=opt.optimizer_name)
def test_grad(optimizer):
    # opt_period 999999: accumulators, never an optimizer step.
    cd = make_ctx_data(optimizer, optimizer_defaults=False, nbatch_logical=999999)
    history = []
    for idata in range(6):
        cd.opt_ctx.alloc(True)
        cd.set_inputs(idata)
        cd.opt_ctx.eval(cd.result)
        history.append(cd.grad_acc())
    assert history == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert cd.w == 3.0


def _assert_nan_accuracy(result):
    acc, acc_unc = result.accuracy()
    assert math.isnan(acc) and math.isnan(acc_unc)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=opt.optimizer_name)
@pytest.mark.parametrize(
    "high_level, shuffle", [(False, False), (True, False), (True, True)],
    ids=["low_level", "high_level", "high_level_shuffle"],
)
def test_forward_backward(optimizer, high_level, shuffle):
    cd = make_ctx_data(optimizer, optimizer_defaults=False)
    ctx, ds, result = cd.opt_ctx, cd.dataset_unsupervised, cd.result

    # results_initial
    assert result.ndata == 0
    loss, unc = result.loss()
    assert abs(loss) < 1e-6 and math.isnan(unc)
    _assert_nan_accuracy(result)

    # forward pass
    if high_level:
        if shuffle:
            ds.shuffle(ctx, -1)
        opt.epoch(ctx, ds, None, result, 0, None, None)
    else:
        for idata in range(6):
            ctx.alloc(False)
            cd.set_inputs(idata)
            ctx.eval(result)
    assert abs(cd.w - 3.0) < 1e-10  # weights_after_forward
    assert result.ndata == 6  # results_after_forward
    loss, unc = result.loss()
    assert abs(loss - 33.0) < 1e-10
    assert abs(unc - math.sqrt(3.5)) < 1e-10
    _assert_nan_accuracy(result)

    # leak step: ten more optimizer steps, then restore the weight and reset.
    w0 = cd.w
    for _ in range(10):
        ctx.alloc(True)
        ctx.eval(result)
    cd.set_w(w0)
    ctx.reset(False)
    result.reset()

    # training pass
    if high_level:
        if shuffle:
            ds.shuffle(ctx, -1)
        opt.epoch(ctx, ds, result, None, 6, None, None)
    else:
        for idata in range(6):
            ctx.alloc(True)
            cd.set_inputs(idata)
            ctx.eval(result)
    assert abs(cd.w - (-3.0)) < 1e-10  # weights_after_forward_backward
    assert result.ndata == 6  # result_after_forward_backward
    loss, unc = result.loss()
    assert abs(loss - 18.0) < 1e-10
    if not shuffle:
        assert unc == 0.0
    _assert_nan_accuracy(result)
