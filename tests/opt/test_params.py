"""Enums, optimizer hyperparameters and context-parameter defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggopt import (
    DTypeError,
    GgoptError,
    InvalidValueError,
    opt,
)
from ggopt.opt.enums import BuildType, LossType, OptimizerType, optimizer_name
from ggopt.opt.params import (
    OptimizerParams,
    default_params,
    get_constant_optimizer_params,
    get_default_optimizer_params,
    optimizer_step_values,
)
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data


def test_enum_values_are_ggmls():
    assert [int(x) for x in LossType] == [0, 1, 2, 3]
    assert [int(x) for x in BuildType] == [10, 20, 30]
    assert BuildType.FORWARD < BuildType.GRAD < BuildType.OPT
    assert [int(x) for x in OptimizerType] == [0, 1]


def test_enum_coerce():
    assert LossType.coerce("cross_entropy", "f") is LossType.CROSS_ENTROPY
    assert LossType.coerce(3, "f") is LossType.MEAN_SQUARED_ERROR
    assert OptimizerType.coerce(OptimizerType.SGD, "f") is OptimizerType.SGD
    with pytest.raises(InvalidValueError, match="unknown LossType 'l1'.*MEAN=0"):
        LossType.coerce("l1", "f")
    with pytest.raises(InvalidValueError, match="unknown BuildType 15"):
        BuildType.coerce(15, "f")
    with pytest.raises(InvalidValueError):
        OptimizerType.coerce(True, "f")


def test_optimizer_name():
    assert optimizer_name(OptimizerType.ADAMW) == "adamw"
    assert optimizer_name(OptimizerType.SGD) == "sgd"
    assert optimizer_name(1) == "sgd"
    assert optimizer_name(2) == "undefined"
    assert optimizer_name("adamw") == "undefined"


def test_default_optimizer_params():
    p = get_default_optimizer_params(object())
    assert (p.adamw.alpha, p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd) == (
        0.001,
        0.9,
        0.999,
        1e-8,
        0.0,
    )
    assert (p.sgd.alpha, p.sgd.wd) == (0.001, 0.0)
    p.adamw.alpha = 5.0
    assert get_default_optimizer_params(None).adamw.alpha == 0.001


def test_constant_optimizer_params_returns_a_copy():
    ud = OptimizerParams()
    ud.sgd.alpha = 0.5
    p = get_constant_optimizer_params(ud)
    assert p == ud and p is not ud and p.sgd is not ud.sgd
    with pytest.raises(DTypeError, match="OptimizerParams"):
        get_constant_optimizer_params({"sgd": 1})


def test_default_params():
    sched = object()
    p = default_params(sched, "sum")
    assert p.backend_sched is sched
    assert p.loss_type is LossType.SUM
    assert p.ctx_compute is None and p.inputs is None and p.outputs is None
    assert p.build_type is BuildType.OPT and p.opt_period == 1
    assert p.get_opt_pars is get_default_optimizer_params and p.get_opt_pars_ud is None
    assert p.optimizer is OptimizerType.ADAMW and p.rng_seed == 5489


def test_adamw_step_values_bias_correction_in_float32():
    p = OptimizerParams()
    for t in (1, 2, 10, 1000):
        v = optimizer_step_values(p, OptimizerType.ADAMW, t)
        assert v.dtype == np.float32 and v.shape == (7,)
        b1, b2 = np.float32(0.9), np.float32(0.999)
        one = np.float32(1)
        assert v[5] == one / (one - b1 ** np.float32(t))
        assert v[6] == one / (one - b2 ** np.float32(t))
        np.testing.assert_array_equal(v[:5], np.float32([0.001, 0.9, 0.999, 1e-8, 0.0]))
    v = optimizer_step_values(p, OptimizerType.ADAMW, 1)
    assert v[5] == pytest.approx(10.0, rel=1e-4) and v[6] == pytest.approx(1000.0, rel=1e-4)


def test_adamw_zero_betas_give_unit_correction():
    p = OptimizerParams()
    p.adamw.beta1 = p.adamw.beta2 = 0.0
    v = optimizer_step_values(p, OptimizerType.ADAMW, 3)
    assert v[5] == 1.0 and v[6] == 1.0


def test_sgd_step_values():
    p = OptimizerParams()
    p.sgd.alpha, p.sgd.wd = 0.25, 1.0
    v = optimizer_step_values(p, OptimizerType.SGD, 7)
    assert v.dtype == np.float32 and v.tolist() == [0.25, 1.0]


@pytest.mark.parametrize(
    "field, value",
    [
        ("alpha", 0.0),
        ("alpha", -1.0),
        ("alpha", math.nan),
        ("beta1", -0.1),
        ("beta1", 1.5),
        ("beta2", 2.0),
        ("eps", -1e-8),
        ("wd", -0.1),
        ("wd", 1.5),
    ],
)
def test_adamw_bounds(field, value):
    p = OptimizerParams()
    setattr(p.adamw, field, value)
    with pytest.raises(InvalidValueError, match=f"adamw.{field}.*ggml_opt_eval"):
        optimizer_step_values(p, OptimizerType.ADAMW, 1)


@pytest.mark.parametrize("field, value", [("alpha", 0.0), ("wd", 1.01), ("wd", -1.0)])
def test_sgd_bounds(field, value):
    p = OptimizerParams()
    setattr(p.sgd, field, value)
    with pytest.raises(InvalidValueError, match=f"sgd.{field}"):
        optimizer_step_values(p, OptimizerType.SGD, 1)


def test_bounds_are_inclusive_where_ggml_is():
    p = OptimizerParams()
    p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd = 1.0, 0.0, 0.0, 1.0
    v = optimizer_step_values(p, OptimizerType.ADAMW, 1)
    assert math.isinf(v[5]) and v[6] == 1.0


def test_step_values_reject_wrong_types():
    with pytest.raises(DTypeError, match="OptimizerParams"):
        optimizer_step_values({"adamw": {}}, OptimizerType.ADAMW, 1)
    p = OptimizerParams()
    p.sgd.alpha = "fast"
    with pytest.raises(DTypeError, match="sgd.alpha"):
        optimizer_step_values(p, OptimizerType.SGD, 1)


@pytest.mark.parametrize("value", [[0.1], (0.1, 0.2), "0.1", None, 10**400])
def test_optimizer_values_of_the_wrong_kind_are_refused_before_a_step(value):
    pars = get_test_opt_pars()
    pars.sgd.alpha = value
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = lambda ud: pars
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    with pytest.raises(GgoptError, match="alpha"):
        ctx.eval()
    assert cd.w == 3.0
    pars.sgd.alpha = 1.0
    ctx.eval()
    assert cd.w == 2.0
