"""Learning-rate schedules: values step by step against closed forms, the position they keep,
their use by fit, and an AdamW step computed by hand with the scheduled rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.errors import DTypeError, InvalidValueError
from tests.support import ckpt as h


def _lrs(schedule, n, userdata=None):
    out = []
    for _ in range(n):
        pars = schedule(userdata)
        assert pars.adamw.alpha == pars.sgd.alpha
        out.append(pars.adamw.alpha)
    return out


def test_constant():
    s = opt.constant(3e-4)
    assert _lrs(s, 5) == [3e-4] * 5
    assert s.step == 5 and s.lr == 3e-4


@pytest.mark.parametrize("lr0,decay,lr_min", [(1e-3, 2.0, 1e-4), (0.5, 0.75, 0.0)])
def test_epoch_decay_per_epoch(lr0, decay, lr_min):
    s = opt.epoch_decay(lr0, decay, lr_min)
    for epoch in range(12):
        s.epoch = epoch
        expected = lr0 * 2.0 ** (-epoch / decay)
        expected = lr_min if expected < lr_min else expected
        assert _lrs(s, 3) == pytest.approx([expected] * 3, rel=1e-15, abs=0)
    assert s.step == 36


def test_epoch_decay_takes_fits_epoch_number():
    s = opt.epoch_decay(1e-3, 1.0, 2e-4)
    # fit calls get_opt_pars(epoch) with its 1-based epoch: epoch 1 runs at lr0.
    assert _lrs(s, 1, userdata=1) == [1e-3]
    assert _lrs(s, 1, userdata=2) == [5e-4]
    assert _lrs(s, 1, userdata=3) == [2.5e-4]
    assert _lrs(s, 1, userdata=4) == [2e-4]  # floored
    assert s.epoch == 3
    assert _lrs(s, 1, userdata=None) == [2e-4]  # other userdata leaves the epoch alone


def test_warmup_cosine_step_by_step():
    lr0, lr_min, warmup, total = 0.01, 0.001, 4, 14
    s = opt.warmup_cosine(lr0, total, warmup, lr_min)
    expected = [lr0 * (k + 1) / warmup for k in range(warmup)]
    expected += [lr_min + (lr0 - lr_min) * (1 + math.cos(math.pi * (k - warmup) / (total - warmup)))
                 / 2 for k in range(warmup, total)]
    expected += [lr_min] * 3
    got = _lrs(s, total + 3)
    assert got == pytest.approx(expected, rel=1e-14, abs=0)
    assert got[warmup] == lr0  # the peak, right after warm-up
    assert all(a > b for a, b in zip(got[warmup:total], got[warmup + 1:total]))
    assert min(got[:total]) > lr_min


def test_warmup_cosine_without_warmup_and_epoch_ignored():
    s = opt.warmup_cosine(1.0, 4, 0)
    assert _lrs(s, 4, userdata=9) == pytest.approx([1.0, 0.8535533905932737, 0.5,
                                                    0.14644660940672627], rel=1e-15)


def test_base_hyperparameters_are_kept():
    base = opt.OptimizerParams()
    base.adamw.beta1, base.adamw.wd, base.sgd.wd = 0.8, 0.01, 0.02
    s = opt.warmup_cosine(0.1, 10, 2, base=base)
    base.adamw.beta1 = 0.5  # the schedule took a copy
    p1, p2 = s(None), s(None)
    assert p1 is not p2
    assert (p1.adamw.beta1, p1.adamw.wd, p1.sgd.wd) == (0.8, 0.01, 0.02)
    assert (p1.adamw.alpha, p2.adamw.alpha) == (0.05, 0.1)


def test_state_round_trip_and_mismatches():
    s = opt.warmup_cosine(0.1, 10, 2, 0.01)
    _lrs(s, 4, userdata=2)
    state = s.state()
    assert state == {"kind": "warmup_cosine", "step": 4, "epoch": 1, "lr0": 0.1,
                     "lr_min": 0.01, "total_steps": 10, "warmup": 2}
    t = opt.warmup_cosine(0.1, 10, 2, 0.01)
    assert t.check_state(state, "here") == (4, 1)
    with pytest.raises(InvalidValueError,
                       match="here: schedule warmup_cosine total_steps: expected 12"):
        opt.warmup_cosine(0.1, 12, 2, 0.01).check_state(state, "here")
    with pytest.raises(InvalidValueError, match="schedule: expected 'epoch_decay'"):
        opt.epoch_decay(0.1, 1.0).check_state(state, "here")
    with pytest.raises(DTypeError, match="schedule step must be an int"):
        t.check_state({**state, "step": "4"}, "here")


@pytest.mark.parametrize("make,exc,match", [
    (lambda: opt.constant(0.0), InvalidValueError, "lr must be > 0"),
    (lambda: opt.constant("1"), DTypeError, "lr must be a real number"),
    (lambda: opt.constant(float("nan")), InvalidValueError, "must be finite"),
    (lambda: opt.epoch_decay(1e-3, 0), InvalidValueError, "decay_epochs must be > 0"),
    (lambda: opt.epoch_decay(1e-3, 1, lr_min=1e-2), InvalidValueError, "lr_min must be in"),
    (lambda: opt.warmup_cosine(1e-3, 5, 5), InvalidValueError, "total_steps must exceed warmup"),
    (lambda: opt.warmup_cosine(1e-3, 5, -1), InvalidValueError, "warmup must be >= 0"),
    (lambda: opt.warmup_cosine(1e-3, 5.0), DTypeError, "total_steps must be an int"),
    (lambda: opt.warmup_cosine(1e-3, 5, lr_min=1e-3), InvalidValueError, "lr_min must be in"),
    (lambda: opt.constant(1e-3, base="adamw"), DTypeError, "base must be an OptimizerParams"),
])
def test_bad_hyperparameters(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


class _Recording(opt.EpochDecayLR):
    """epoch_decay that records (step, epoch, lr) of every call."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = []

    def __call__(self, userdata=None):
        pars = super().__call__(userdata)
        self.calls.append((self.step - 1, self.epoch, pars.adamw.alpha))
        return pars


def test_fit_calls_schedule_once_per_optimizer_step():
    s = _Recording(0.01, 1.0, 0.0)
    h.fit_run(3, h.SGD, s)
    assert [c[:2] for c in s.calls] == [(k, k // h.STEPS_PER_EPOCH) for k in range(9)]
    assert [c[2] for c in s.calls] == [0.01] * 3 + [0.005] * 3 + [0.0025] * 3
    assert (s.step, s.epoch) == (9, 2)


def test_optimizer_uses_the_scheduled_rate():
    """Weights after every AdamW step equal the hand-computed update with the scheduled lr."""
    cpu = gb.cpu_init()
    ctx_static = ggopt.Context()
    x = ggopt.set_name(ctx_static.new_tensor_2d(ggopt.F32, 5, 1), "x")
    ggopt.set_input(x)
    w = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 5), "w")
    ggopt.set_param(w)
    gb.alloc_ctx_tensors(ctx_static, cpu)
    ctx_compute = ggopt.Context()
    out = ggopt.mul(ctx_compute, x, w)  # loss = sum(w * x): the gradient is x

    base = opt.OptimizerParams()
    base.adamw.wd = 0.05
    sched = opt.warmup_cosine(0.2, 5, warmup=2, lr_min=0.01, base=base)
    params = opt.default_params(ggopt.backend.Scheduler([cpu]), opt.LossType.SUM)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, x, out
    params.get_opt_pars = sched

    rng = np.random.default_rng(3)
    w_ref = rng.standard_normal(5).astype(np.float32)
    gb.tensor_set(w, w_ref)
    m_ref, v_ref = np.zeros(5, np.float32), np.zeros(5, np.float32)
    f = np.float32
    b1, b2, eps, wd = f(0.9), f(0.999), f(1e-8), f(0.05)
    with opt.OptContext(params) as ctx:
        for t in range(1, 7):
            g = rng.standard_normal(5).astype(np.float32)
            alpha = f(sched.lr)
            gb.tensor_set(x, g)
            ctx.alloc(True)
            ctx.eval(None)
            m_ref = m_ref * b1 + g * (f(1) - b1)
            v_ref = v_ref * b2 + g * g * (f(1) - b2)
            b1h = f(1) / (f(1) - b1 ** f(t))
            b2h = f(1) / (f(1) - b2 ** f(t))
            w_ref = w_ref * (f(1) - alpha * wd) - alpha * (m_ref * b1h) / (np.sqrt(v_ref * b2h)
                                                                          + eps)
            np.testing.assert_array_equal(gb.tensor_get(w), w_ref)
    assert sched.step == 6  # the last step ran past total_steps, at lr_min
