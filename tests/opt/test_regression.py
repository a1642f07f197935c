"""ggml test-opt: test_regression (ggml-opt-spec §7.8), with bit-exact data (Appendix B.3)."""

from __future__ import annotations

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.opt.rng import Mt19937

NDATA = 201
SGD_EPOCHS = 900


def regression_data() -> tuple[np.ndarray, np.ndarray]:
    """x in -100..100 and y = 1.2x + 3.4 + N(0, 0.1) noise from std::mt19937(12345)."""
    i = np.arange(NDATA, dtype=np.float32)
    x = np.float32(-100) + np.float32(200) * i / np.float32(NDATA - 1)
    noise = Mt19937(12345).normal_f32(NDATA, 0.0, 0.1)
    y = np.float32(1.2) * x + np.float32(3.4) + noise
    return x, y


def regression_opt_pars(epoch: int) -> opt.OptimizerParams:
    """``helper_get_regression_opt_pars``: AdamW alpha 0.1, SGD with a decaying rate."""
    p = opt.get_default_optimizer_params(None)
    p.adamw.alpha = 0.1
    p.sgd.alpha = float(np.float32(1e-4)) * 0.99 ** (1000 * float(epoch) / SGD_EPOCHS)
    p.sgd.wd = 1e-10
    return p


def test_regression_data_is_bit_exact():
    x, y = regression_data()
    assert x.dtype == y.dtype == np.float32
    assert x[0] == -100 and x[100] == 0 and x[-1] == 100 and np.all(np.diff(x) == 1)
    assert y[:3].tolist() == np.float32([-116.678589, -115.439079, -114.147118]).tolist()


def _fit_regression(optimizer: opt.OptimizerType, nepoch: int) -> tuple[float, float]:
    x_data, y_data = regression_data()
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 1, 1, NDATA, NDATA)
    ds.data.numpy()[:, 0] = x_data
    ds.labels.numpy()[:, 0] = y_data

    backend = gb.cpu_init()
    sched = gb.Scheduler([backend])
    ctx_static = ggopt.Context()
    x = ggopt.set_name(ctx_static.new_tensor_2d(ggopt.F32, 1, NDATA), "x")
    a = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 1), "a")
    b = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 1), "b")
    ggopt.set_param(a)
    ggopt.set_param(b)
    gb.alloc_ctx_tensors(ctx_static, backend)
    a.numpy()[0], b.numpy()[0] = 1.0, 3.0

    ctx_compute = ggopt.Context()
    f = ggopt.set_name(ggopt.add(ctx_compute, ggopt.mul(ctx_compute, x, a), b), "f")
    opt.fit(
        sched, ctx_compute, x, f, ds, opt.LossType.MEAN_SQUARED_ERROR, optimizer,
        regression_opt_pars, nepoch, NDATA, 0.0, True,
    )
    return float(a.numpy()[0]), float(b.numpy()[0])


def test_regression_adamw():
    a, b = _fit_regression(opt.OptimizerType.ADAMW, 100)
    assert abs(a - 1.2) < 1e-2 and abs(b - 3.4) < 1e-2  # ggml's check
    # Bitwise the values measured on ggml's CPU backend.
    assert np.float32(a) == np.float32(1.20068681)
    assert np.float32(b) == np.float32(3.40178657)


def test_regression_sgd():
    # ggml computes but ignores a 5e-2 check here: b has not converged after 900 epochs.
    a, b = _fit_regression(opt.OptimizerType.SGD, SGD_EPOCHS)
    assert np.float32(a) == np.float32(1.19981372)
    assert np.float32(b) == np.float32(3.0071106)
