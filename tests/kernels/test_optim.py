"""ggopt._kernels._optim against float32 NumPy versions of ggml's AdamW and SGD formulas."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _optim as O
from ggopt.errors import ShapeError
from tests.support.helpers import adamw_params
from tests.support.sizes import OPTIM_SIZES

THREADS = [1, 2]
SIZES = OPTIM_SIZES  # the last one spans several parallel chunks


def adamw_ref(w, g, m, v, params):
    """ggml_compute_forward_opt_step_adamw_f32, in float32, in place (checks the rounding; the
    independent reference is torch.optim.AdamW in tests/opt/test_torch_parity.py)."""
    alpha, b1, b2, eps, wd, b1h, b2h = (np.float32(p) for p in params)
    one = np.float32(1)
    keep = one - alpha * wd
    m[:] = m * b1 + g * (one - b1)
    v[:] = v * b2 + g * g * (one - b2)
    mh = m * b1h
    vh = np.sqrt(v * b2h) + eps
    w[:] = w * keep - alpha * mh / vh


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_matches_float32_reference(rng, n, wd, n_threads):
    w = rng.standard_normal(n).astype(np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    w_ref, m_ref, v_ref = w.copy(), m.copy(), v.copy()
    for t in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        params = adamw_params(1e-3, 0.9, 0.999, 1e-8, wd, t)
        O.adamw_step(w, g, m, v, params, n_threads)
        adamw_ref(w_ref, g, m_ref, v_ref, params)
    np.testing.assert_allclose(m, m_ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(v, v_ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(w, w_ref, rtol=1e-6, atol=1e-9)


def test_adamw_read_only_gradient_and_params(rng):
    g = rng.standard_normal(10).astype(np.float32)
    params = adamw_params(0.01, 0.9, 0.999, 1e-8, 0.0, 1)
    g.setflags(write=False)
    params.setflags(write=False)
    w = np.ones(10, np.float32)
    O.adamw_step(w, g, np.zeros(10, np.float32), np.zeros(10, np.float32), params, 1)
    # first step with zero moments: w = 1 - alpha * sign(g) up to eps
    np.testing.assert_allclose(w, 1 - 0.01 * np.sign(g), rtol=1e-5)


def test_adamw_errors_leave_arrays_untouched():
    w = np.ones(4, np.float32)
    good = adamw_params(0.1, 0.9, 0.999, 1e-8, 0.0, 1)
    with pytest.raises(ShapeError, match="same length"):
        O.adamw_step(
            w, np.ones(3, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32), good, 1
        )
    with pytest.raises(ShapeError, match="7 values"):
        O.adamw_step(
            w, np.ones(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32), good[:6], 1
        )
    strided = np.ones(8, np.float32)
    with pytest.raises(ValueError):  # not contiguous
        O.adamw_step(
            strided[::2],
            np.ones(4, np.float32),
            np.zeros(4, np.float32),
            np.zeros(4, np.float32),
            good,
            1,
        )
    np.testing.assert_array_equal(w, 1)
    np.testing.assert_array_equal(strided, 1)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_matches_float32_reference(rng, n, wd, n_threads):
    w = rng.standard_normal(n).astype(np.float32)
    w_ref = w.copy()
    params = np.array([0.05, wd], np.float32)
    alpha, wd32 = params
    for _ in range(3):
        g = rng.standard_normal(n).astype(np.float32)
        O.sgd_step(w, g, params, n_threads)
        w_ref = w_ref * (np.float32(1) - alpha * wd32) - alpha * g
    np.testing.assert_allclose(w, w_ref, rtol=1e-6, atol=1e-9)


def test_sgd_errors():
    w = np.ones(4, np.float32)
    with pytest.raises(ShapeError, match="same length"):
        O.sgd_step(w, np.ones(5, np.float32), np.array([0.1, 0.0], np.float32), 1)
    with pytest.raises(ShapeError, match="2 values"):
        O.sgd_step(w, np.ones(4, np.float32), np.array([0.1], np.float32), 1)
    np.testing.assert_array_equal(w, 1)


def test_empty_parameters_are_a_no_op():
    # every array is an empty window into a guarded buffer: nothing may be written around it
    guard = np.full(16, 5.0, np.float32)
    e = guard[4:4]
    adamw = adamw_params(0.1, 0.9, 0.999, 1e-8, 0.0, 1)
    sgd = np.array([0.1, 0.0], np.float32)
    assert O.adamw_step(e, e, e, e, adamw, 2) is None
    assert O.sgd_step(e, e, sgd, 2) is None
    assert (guard == 5.0).all()
    np.testing.assert_array_equal(adamw, adamw_params(0.1, 0.9, 0.999, 1e-8, 0.0, 1))
    np.testing.assert_array_equal(sgd, np.array([0.1, 0.0], np.float32))
    with pytest.raises(ShapeError, match="same length"):  # empty w, non-empty gradient
        O.sgd_step(e, guard[:3], sgd, 2)
    assert (guard == 5.0).all()
