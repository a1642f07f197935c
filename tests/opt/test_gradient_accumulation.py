"""ggml test-opt: test_gradient_accumulation (ggml-opt-spec §7.7) plus its SGD counterpart."""

from __future__ import annotations

import math

import pytest

from ggopt import opt
from tests.support.opt_fixture import make_ctx_data

ATOL = 1e-6


def _run_epoch(cd, nbatch_physical):
    """One epoch of 6 datapoints; returns the accumulator history as ggml's test records it."""
    gh = [0.0] * 6
    for i in range(0, 6, nbatch_physical):
        cd.opt_ctx.alloc(True)
        cd.set_inputs(*range(i, i + nbatch_physical))
        cd.opt_ctx.eval(cd.result)
        gh[i + nbatch_physical - 1] = cd.grad_acc()
    return gh


@pytest.mark.parametrize("nbatch_physical", [2, 1])
@pytest.mark.parametrize("loss_type", [opt.LossType.SUM, opt.LossType.MEAN], ids=["sum", "mean"])
def test_gradient_accumulation(nbatch_physical, loss_type):
    cd = make_ctx_data(
        opt.OptimizerType.ADAMW, optimizer_defaults=False, nbatch_logical=6,
        nbatch_physical=nbatch_physical, loss_type=loss_type,
    )
    assert cd.opt_ctx.opt_period == 6 // nbatch_physical
    scale = 1.0 if loss_type is opt.LossType.SUM else 1.0 / 6
    expected_grads = [1, 2, 3, 4, 5, 6] if nbatch_physical == 1 else [0, 2, 0, 4, 0, 6]
    for epoch in range(1, 5):
        gh = _run_epoch(cd, nbatch_physical)
        for got, want in zip(gh, expected_grads, strict=True):
            assert abs(got - want * scale) < ATOL  # grads
        assert abs(cd.w - (3 - epoch)) < ATOL  # weights

        assert cd.result.ndata == 6 // nbatch_physical  # results
        loss, _ = cd.result.loss()
        assert abs(loss - (39 - 6 * epoch) * scale) < ATOL
        acc, acc_unc = cd.result.accuracy()
        assert math.isnan(acc) and math.isnan(acc_unc)
        cd.result.reset()


@pytest.mark.parametrize("nbatch_physical", [2, 1])
@pytest.mark.parametrize("loss_type", [opt.LossType.SUM, opt.LossType.MEAN], ids=["sum", "mean"])
def test_gradient_accumulation_sgd(nbatch_physical, loss_type):
    # SGD steps by the accumulated gradient itself: 6 per logical batch for SUM, 1 for MEAN.
    cd = make_ctx_data(
        opt.OptimizerType.SGD, optimizer_defaults=False, nbatch_logical=6,
        nbatch_physical=nbatch_physical, loss_type=loss_type,
    )
    step = 6.0 if loss_type is opt.LossType.SUM else 1.0
    for epoch in range(1, 4):
        gh = _run_epoch(cd, nbatch_physical)
        assert abs(gh[-1] - step) < ATOL
        assert abs(cd.w - (3 - step * epoch)) < ATOL
