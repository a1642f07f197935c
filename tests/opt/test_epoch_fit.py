"""ggml test-opt: test_epoch_vs_fit and test_idata_split (ggml-opt-spec §7.5-7.6), fit's split
arithmetic, its output and history, and reproducibility across thread counts."""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest

import ggopt
from ggopt import (
    InvalidValueError,
    opt,
)
from ggopt import backend as gb
from ggopt.opt.training import fit_split
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data
from tests.support.terminal import Terminal
from tests.support.threadcheck import (
    PARALLEL_ELEMENTS,
    count_new_threads,
    fresh_team_size,
    skip_unless_observable,
)

OPTIMIZERS = [opt.OptimizerType.ADAMW, opt.OptimizerType.SGD]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=opt.optimizer_name)
def test_epoch_vs_fit(optimizer):
    cd = make_ctx_data(optimizer)
    cd.dataset_unsupervised.shuffle(cd.opt_ctx, -1)
    opt.epoch(cd.opt_ctx, cd.dataset_unsupervised, cd.result, None, 6, None, None)
    w_epoch = cd.w

    cd = make_ctx_data(optimizer, init_opt_ctx=False)
    opt.fit(
        cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
        opt.LossType.SUM, optimizer, opt.get_default_optimizer_params, 1, 1, 0.0, True,
    )
    w_fit = cd.w
    assert w_epoch == w_fit
    assert np.float32(w_fit) == np.float32(float.fromhex("0x1.7f3b68p+1"))  # 2.99400043


@pytest.mark.parametrize("high_level", [False, True], ids=["low_level", "high_level"])
def test_idata_split(high_level):
    cd = make_ctx_data(opt.OptimizerType.ADAMW, optimizer_defaults=False)
    ctx, ds = cd.opt_ctx, cd.dataset_unsupervised
    idata_split = 6 * 2 // 3
    for epoch in range(1, 5):
        if high_level:
            opt.epoch(ctx, ds, cd.result, cd.result2, idata_split, None, None)
        else:
            for idata in range(6):
                ctx.alloc(idata < idata_split)
                cd.set_inputs(idata)
                ctx.eval(cd.result if idata < idata_split else cd.result2)
        assert abs(cd.w - (3 - 4 * epoch)) < 1e-10

        assert cd.result.ndata == 4
        loss, unc = cd.result.loss()
        assert abs(loss - (28 - 16 * epoch)) < 1e-10
        assert abs(unc) < 1e-10
        assert all(math.isnan(x) for x in cd.result.accuracy())

        assert cd.result2.ndata == 2
        loss, unc = cd.result2.loss()
        assert abs(loss - (15 - 8 * epoch)) < 1e-10
        assert abs(unc - math.sqrt(0.5)) < 1e-10
        assert all(math.isnan(x) for x in cd.result2.accuracy())

        cd.result.reset()
        cd.result2.reset()


@pytest.mark.parametrize(
    "ndata, nbatch_logical, nbatch_physical, val_split, expected",
    [
        (60000, 1000, 500, 0.05, (2, 57000)),  # MNIST: 0.95f*60 -> 57
        (6, 1, 1, 0.34, (1, 3)),  # 0.66f*6 = 3.9599998f -> 3
        (6, 1, 1, 0.0, (1, 6)),
        (6, 6, 2, 0.5, (3, 0)),  # 0.5*1 -> 0 logical batches of training
        (201, 201, 201, 0.0, (1, 201)),
        (10, 2, 1, 0.3, (2, 6)),  # float32: 0.7f*5 = 3.5 -> 3
    ],
)
def test_fit_split_float32(ndata, nbatch_logical, nbatch_physical, val_split, expected):
    assert fit_split(ndata, nbatch_logical, nbatch_physical, val_split) == expected


def test_fit_split_truncates_in_float32_not_float64():
    # 1 - 0.1f rounds to 0.9f and 0.9f*10 to exactly 9.0f; in float64 it is 8.99999998.
    assert fit_split(10, 1, 1, 0.1) == (1, 9)
    assert int((1 - float(np.float32(0.1))) * 10) == 8
    # 1 - 0.7f = 0.3f (0.30000001192...), *10 = 3.0000002f: still 3 in float32.
    assert fit_split(10, 1, 1, 0.7) == (1, 3)


def _fit(cd, optimizer=opt.OptimizerType.SGD, **kw):
    args = dict(
        loss_type=opt.LossType.SUM, optimizer=optimizer, get_opt_pars=get_test_opt_pars,
        nepoch=2, nbatch_logical=1, val_split=0.34, silent=True,
    )
    args.update(kw)
    return opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised, **args)


def test_fit_history_sum_loss():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    history = _fit(cd)
    assert len(history) == 2 and len(history.val_loss) == 2
    assert all(s >= 0 for s in history.seconds)
    # The first shuffle holds out datapoints {5, 4, 1}; training sees {2, 3, 0} at w = 3, 2, 1
    # (epoch 1) and w = 0, -1, -2 (epoch 2); validation runs at w = 0 and w = -3.
    assert history.train_loss == [11.0, 2.0]
    assert history.val_loss == [10.0, 1.0]
    assert abs(history.train_loss_unc[0] - 2.30940) < 1e-5
    assert abs(history.val_loss_unc[0] - math.sqrt(13 / 3)) < 1e-12
    for name in ("train_acc", "train_acc_unc", "val_acc", "val_acc_unc"):
        assert all(math.isnan(x) for x in getattr(history, name))
    assert cd.w == -3.0


def test_fit_output_matches_ggml_format():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    stream = Terminal()  # on a terminal the bars are ggml's, redrawn in place
    _fit(cd, silent=False, stream=stream)
    text = stream.getvalue()
    lines = text.split("\n")
    assert lines[0] == "ggml_opt_fit: epoch 0001/0002:"
    train = lines[1].split("\r")
    assert len(train) == 4  # three redraws, the last one followed by "\n"
    assert train[0].startswith("train: [██▋     ] data=0000001/0000003 loss=")
    assert re.fullmatch(
        r"train: \[███████▉\] data=0000003/0000003 loss=11\.00000±\d\.\d{5} acc=nan±nan% "
        r"t=\d\d:\d\d:\d\d ETA=00:00:00 ",
        train[2],
    )
    assert lines[2].split("\r")[2].startswith("val:   [███████▉] data=0000003/0000003 loss=")
    assert lines[3] == ""
    assert lines[4] == "ggml_opt_fit: epoch 0002/0002:"
    assert re.fullmatch(r"ggml_opt_fit: training took \d\d:\d\d:\d\d", lines[-2])
    assert lines[-1] == ""


def test_fit_output_off_a_terminal_is_whole_lines():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    stream = io.StringIO()
    _fit(cd, silent=False, stream=stream)
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.split("\n")
    assert lines[0] == "ggml_opt_fit: epoch 0001/0002:"
    # three batches: each is a milestone (the first, a new tenth, the last), one line each
    assert [line.split(" loss=")[0] for line in lines[1:7]] == [
        f"{part}[{bar}] data=000000{i}/0000003" for part in ("train: ", "val:   ")
        for i, bar in ((1, "██▋     "), (2, "█████▎  "), (3, "███████▉"))]
    assert re.fullmatch(r"ggml_opt_fit: training took \d\d:\d\d:\d\d", lines[-2])


def test_fit_silent_prints_nothing(capsys):
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    _fit(cd)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_fit_without_validation_records_nan():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    history = _fit(cd, val_split=0.0, nepoch=1)
    assert history.train_loss == [18.0] and history.train_loss_unc[0] >= 0
    assert math.isnan(history.val_loss[0]) and math.isnan(history.val_loss_unc[0])


def test_fit_passes_live_epoch_to_get_opt_pars():
    seen = []

    def pars(ud):
        seen.append(ud)
        return get_test_opt_pars()

    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    _fit(cd, get_opt_pars=pars, nepoch=3, nbatch_logical=2, val_split=0.0)
    assert seen == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def _fit_large_model(optimizer: opt.OptimizerType, n_threads: int) -> tuple:
    """fit of ``outputs = sqr(inputs + weights)`` with 1.25x PARALLEL_ELEMENTS weights, so that
    every kernel of the step (get_batch, add, sqr, sum, their backward, the optimizer) is above
    its parallel threshold; no matrix products, so only OpenMP can start threads.

    Returns (initial weights, final weights, train losses, val losses, OS threads that fit
    started)."""
    n = PARALLEL_ELEMENTS * 5 // 4
    rng = np.random.default_rng(7)
    ds = opt.Dataset(ggopt.F32, ggopt.F32, n, 0, 6, 1)
    ds.data.numpy()[:] = rng.uniform(-1, 1, (6, n)).astype(np.float32)
    backend = gb.cpu_init()
    ctx_static = ggopt.Context()
    inputs = ctx_static.new_tensor_2d(ggopt.F32, n, 1)
    weights = ctx_static.new_tensor_1d(ggopt.F32, n)
    ggopt.set_param(weights)
    gb.alloc_ctx_tensors(ctx_static, backend)
    weights.numpy()[:] = rng.uniform(-1, 1, n).astype(np.float32)
    initial = weights.numpy().copy()
    ctx_compute = ggopt.Context()
    outputs = ggopt.sqr(ctx_compute, ggopt.add(ctx_compute, inputs, weights))
    ggopt.set_n_threads(n_threads)  # before counting: it resizes BLAS's thread pool
    try:
        history = None

        def run():
            nonlocal history
            history = opt.fit(gb.Scheduler([backend]), ctx_compute, inputs, outputs, ds,
                              opt.LossType.SUM, optimizer, opt.get_default_optimizer_params,
                              3, 2, 0.34, True)

        started = count_new_threads(run)
    finally:
        ggopt.set_n_threads(None)
    return initial, weights.numpy().copy(), history.train_loss, history.val_loss, started


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=opt.optimizer_name)
def test_fit_bitwise_independent_of_thread_count(optimizer):
    skip_unless_observable()
    one = _fit_large_model(optimizer, 1)
    assert one[4] == 0
    # A team larger than any parked one must create threads if fit's kernels go parallel; the
    # kernels' choice does not depend on the count beyond 1, so 2 threads go parallel too.
    many = _fit_large_model(optimizer, fresh_team_size())
    assert many[4] >= 1, "fit never started a second thread"
    two = _fit_large_model(optimizer, 2)
    assert np.mean(one[1] != one[0]) > 0.99, "fit left the weights (nearly) untouched"
    for other in (two, many):
        assert other[1].tobytes() == one[1].tobytes()
        # sum() adds one float64 partial sum per thread: the loss may differ in its last bit
        np.testing.assert_allclose(other[2], one[2], rtol=1e-6)
        np.testing.assert_allclose(other[3], one[3], rtol=1e-6)



def test_fit_cross_entropy_classifier():
    # Three well separated 2-D clusters, a linear model; batches of 50, optimizer steps of 100.
    rng = np.random.default_rng(1)
    n = 300
    cls = np.arange(n) % 3
    centers = np.array([[2.0, 0.0], [-2.0, 2.0], [-2.0, -2.0]], np.float32)
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 2, 3, n, 10)
    ds.data.numpy()[:] = centers[cls] + 0.3 * rng.standard_normal((n, 2)).astype(np.float32)
    ds.labels.numpy()[:] = np.eye(3, dtype=np.float32)[cls]

    backend = gb.cpu_init()
    sched = gb.Scheduler([backend])
    ctx_static = ggopt.Context()
    images = ctx_static.new_tensor_2d(ggopt.F32, 2, 50)
    weight = ctx_static.new_tensor_2d(ggopt.F32, 2, 3)
    bias = ctx_static.new_tensor_1d(ggopt.F32, 3)
    ggopt.set_param(weight)
    ggopt.set_param(bias)
    gb.alloc_ctx_tensors(ctx_static, backend)
    weight.numpy()[:] = 0.01 * rng.standard_normal((3, 2)).astype(np.float32)
    bias.numpy()[:] = 0.0
    ctx_compute = ggopt.Context()
    logits = ggopt.add(ctx_compute, ggopt.mul_mat(ctx_compute, weight, images), bias)

    def pars(epoch):
        p = opt.get_default_optimizer_params(None)
        p.adamw.alpha = 0.05
        return p

    history = opt.fit(sched, ctx_compute, images, logits, ds, opt.LossType.CROSS_ENTROPY,
                      opt.OptimizerType.ADAMW, pars, 6, 100, 0.2, True)
    assert len(history) == 6
    assert history.train_loss[-1] < history.train_loss[0]
    assert history.train_acc[-1] > 0.95 and history.val_acc[-1] > 0.95
    assert 0 <= history.val_acc_unc[-1] < 0.05
    assert all(math.isfinite(x) for x in history.val_loss + history.val_loss_unc)


def test_fit_refuses_an_overflowing_val_split():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    with pytest.raises(InvalidValueError, match="val_split"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.SGD, get_test_opt_pars, 1, 1, 10**400, True)
    assert cd.w == 3.0
