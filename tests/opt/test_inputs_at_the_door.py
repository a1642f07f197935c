"""Public opt values checked where they enter: optimizer values and
schedule constants in float32, the kernels' type; fit's checkpoint path and a run's rates before
training; batch destinations before anything is copied."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

import ggopt
from ggopt import opt
from ggopt.errors import DTypeError, InvalidValueError
from ggopt.opt.params import AdamWParams, SGDParams, optimizer_step_values
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data


@pytest.mark.parametrize("make, name", [
    (lambda: opt.warmup_cosine(1e300, 10), "lr0"),
    (lambda: opt.epoch_decay(1e-3, 1e-300), "decay_epochs"),
    (lambda: opt.epoch_decay(1e300, 1.0), "lr0"),
    (lambda: opt.constant(1e-50), "lr"),
    (lambda: opt.constant(1e-40), "lr"),
    (lambda: opt.epoch_decay(1e-3, 1.0, lr_min=1e-41), "lr_min"),
    (lambda: opt.warmup_cosine(1e-36, 1000, warmup=500), "learning rate of step 0"),
])
def test_schedule_constants_checked_in_float32(make, name):
    with pytest.raises(InvalidValueError, match=re.escape(name)):
        make()


def test_schedule_base_hyperparameters_checked_when_given():
    base = opt.OptimizerParams()
    base.adamw.wd = 5.0
    with pytest.raises(InvalidValueError, match=r"adamw\.wd"):
        opt.constant(1e-3, base)
    base.adamw.wd, base.adamw.eps = 0.0, 1e300
    with pytest.raises(InvalidValueError, match=r"adamw\.eps"):
        opt.warmup_cosine(1e-3, 10, base=base)


def test_schedule_check_run_covers_the_whole_run():
    opt.epoch_decay(1e-3, 1.0).check_run(30, 5, "here")  # 1e-3 / 2**29 is still normal
    with pytest.raises(InvalidValueError, match=r"\(epoch 200\) .*\(here\)"):
        opt.epoch_decay(1e-3, 1.0).check_run(200, 5, "here")  # 1e-3 / 2**199 flushes
    opt.warmup_cosine(1e-3, 10).check_run(2, 5, "here")
    with pytest.raises(InvalidValueError, match=r"step 20 \(epoch 2\)"):
        opt.warmup_cosine(1e-3, 10).check_run(2, 10, "here")  # past total_steps: lr_min = 0


@pytest.mark.parametrize("make, name", [
    (lambda: AdamWParams(alpha=1e300), "adamw.alpha"),
    (lambda: AdamWParams(alpha=1e-50), "adamw.alpha"),
    (lambda: AdamWParams(beta1=math.nan), "adamw.beta1"),
    (lambda: AdamWParams(beta2=1.5), "adamw.beta2"),
    (lambda: AdamWParams(eps=1e-45), "adamw.eps"),
    (lambda: AdamWParams(wd=-0.1), "adamw.wd"),
    (lambda: SGDParams(alpha=math.inf), "sgd.alpha"),
    (lambda: SGDParams(wd=1e-39), "sgd.wd"),
])
def test_optimizer_params_checked_in_float32_when_constructed(make, name):
    with pytest.raises(InvalidValueError, match=re.escape(name)):
        make()


def test_optimizer_params_wrong_types_when_constructed():
    with pytest.raises(DTypeError, match=r"adamw\.alpha"):
        AdamWParams(alpha="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value", [("alpha", 1e300), ("alpha", 1e-40), ("eps", 1e39),
                                          ("wd", 1e-42)])
def test_step_values_outside_float32_are_refused(field, value):
    pars = opt.OptimizerParams()
    setattr(pars.adamw, field, value)
    with pytest.raises(InvalidValueError, match=rf"adamw\.{field}"):
        optimizer_step_values(pars, opt.OptimizerType.ADAMW, 1)
    pars = opt.OptimizerParams()
    if field in ("alpha", "wd"):
        setattr(pars.sgd, field, value)
        with pytest.raises(InvalidValueError, match=rf"sgd\.{field}"):
            optimizer_step_values(pars, opt.OptimizerType.SGD, 1)


def test_fit_refuses_a_schedule_that_reaches_zero_before_training():
    cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    w = cd.w
    with pytest.raises(InvalidValueError, match="learning rate of optimizer step"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.ADAMW, opt.epoch_decay(1.0, 1e-30), 3, 1,
                0.0, True)
    assert cd.w == w


@pytest.mark.parametrize("checkpoint, message", [("", "empty"), (".", "is a directory"),
                                                 ("nodir/ck.gguf", "does not exist")])
def test_fit_checks_the_checkpoint_path_before_training(checkpoint, message, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    w = cd.w
    with pytest.raises(InvalidValueError, match=f"checkpoint .*{message}"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.SGD, get_test_opt_pars, 2, 1, 0.0, True,
                checkpoint=checkpoint)
    assert cd.w == w
    assert os.listdir(tmp_path) == []


def _dataset() -> opt.Dataset:
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 4, 2, 8, 1)
    ds.data.numpy()[:] = np.arange(32, dtype=np.float32).reshape(8, 4)
    ds.labels.numpy()[:] = np.arange(16, dtype=np.float32).reshape(8, 2)
    return ds


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself
def test_get_batch_host_refuses_a_matrix():
    ds = _dataset()
    with pytest.raises(DTypeError, match="matrix"):
        ds.get_batch_host(np.asmatrix(np.zeros((2, 4), np.float32)),
                          np.zeros((2, 2), np.float32), 0)


def test_get_batch_host_refuses_destinations_in_the_datasets_storage():
    ds = _dataset()
    data, labels = ds.data.numpy().copy(), ds.labels.numpy().copy()
    with pytest.raises(InvalidValueError, match="data_arr shares memory with the dataset's data"):
        ds.get_batch_host(ds.data.numpy()[4:6], np.zeros((2, 2), np.float32), 0)
    with pytest.raises(InvalidValueError, match="labels_arr shares memory with the dataset's "
                                                "data"):
        ds.get_batch_host(np.zeros((2, 4), np.float32), ds.data.numpy()[6, :].reshape(2, 2), 0)
    with pytest.raises(InvalidValueError, match="labels"):
        ds.get_batch_host(np.zeros((2, 4), np.float32), ds.labels.numpy()[2:4], 0)
    both = np.zeros(12, np.float32)
    with pytest.raises(InvalidValueError, match="data_arr and labels_arr share memory"):
        ds.get_batch_host(both[:8].reshape(2, 4), both[6:10].reshape(2, 2), 0)
    np.testing.assert_array_equal(ds.data.numpy(), data)
    np.testing.assert_array_equal(ds.labels.numpy(), labels)
    out_d, out_l = np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32)
    ds.get_batch_host(out_d, out_l, 1)  # separate arrays: fine
    np.testing.assert_array_equal(out_d, data[2:4])


def test_cached_step_checks_still_refuse_a_bool_equal_to_a_checked_int():
    """The per-step checks are cached by value and type: True == 1, but True is refused."""
    assert AdamWParams(alpha=1, wd=0).alpha == 1
    with pytest.raises(DTypeError, match="real number"):
        AdamWParams(alpha=True, wd=0)
    with pytest.raises(DTypeError, match="real number"):
        AdamWParams(alpha=1, wd=False)
