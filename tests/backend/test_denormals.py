"""Flush-to-zero during graph computes (``ggopt/backend/cpu/denormals.py``,
``_kernels/_fpmode.pyx``).

1e-20 * 1e-20 = 1e-40 is subnormal in float32: a flushing compute writes 0, IEEE arithmetic
(NumPy, or ggopt with ``set_flush_denormals(False)``) writes about 1e-40. Products, element-wise
kernels, the OpenMP team threads and NumPy's matmul fallback must all agree, for any thread
count, and every thread must be back to IEEE arithmetic after the compute.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt._kernels import _elementwise as ew
from ggopt._kernels import _fpmode
from ggopt.backend.cpu.denormals import ComputeFloatMode
from ggopt.backend.cpu.ops import linalg
from tests.support.helpers import run
from tests.support.threadcheck import large_2d

pytestmark = pytest.mark.skipif(not _fpmode.supported(),
                                reason="flush-to-zero is set on x86 only")

TINY = np.float32(1e-20)  # normal; its square is subnormal


@pytest.fixture
def flush_setting():
    yield
    ggopt.set_flush_denormals(True)


def _compute(build, arrays, n_threads):
    """Result of ``build(ctx, *leafs)`` on a CPU backend of ``n_threads``."""
    return run(build, *arrays, n_threads=n_threads)[0]


def _tiny(shape):
    return np.full(shape, TINY, np.float32)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_products_and_elementwise_flush_for_any_thread_count(n_threads):
    a, b = _tiny(large_2d()), _tiny(large_2d())
    got = _compute(lambda c, x, y: ggopt.mul(c, x, y), [a, b], n_threads)
    assert not got.any()  # every 1e-40 flushed to 0
    # 512 x 256 outputs of 40 products of 1e-40: big enough to be cut in two pieces
    w, x = _tiny((256, 40)), _tiny((512, 40))
    got = _compute(lambda c, p, q: ggopt.mul_mat(c, p, q), [w, x], n_threads)
    assert got.shape == (512, 256) and not got.any()


def test_ieee_subnormals_when_switched_off(flush_setting):
    ggopt.set_flush_denormals(False)
    assert not ggopt.get_flush_denormals()
    a, b = _tiny(large_2d()), _tiny(large_2d())
    got = _compute(lambda c, x, y: ggopt.mul(c, x, y), [a, b], 2)
    np.testing.assert_array_equal(got, a * b)
    assert (got > 0).all()
    w, x = _tiny((256, 40)), _tiny((512, 40))
    got = _compute(lambda c, p, q: ggopt.mul_mat(c, p, q), [w, x], 2)
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=0)
    assert (got > 0).all()


def test_threads_are_ieee_again_after_a_compute():
    a, b = _tiny(large_2d()), _tiny(large_2d())
    _compute(lambda c, x, y: ggopt.mul(c, x, y), [a, b], 2)
    assert not _fpmode.flushing()
    out = np.empty_like(a)  # the same kernel outside a compute, on the same team threads
    ew.binary(ew.BIN_MUL, a.reshape(1, 1, *a.shape), b.reshape(1, 1, *b.shape),
              out.reshape(1, 1, *out.shape), 2)
    np.testing.assert_array_equal(out, a * b)


def test_the_callers_own_flush_state_is_kept():
    saved = _fpmode.set_this_thread(True)
    try:
        _compute(lambda c, x: ggopt.scale(c, x, 2.0), [_tiny((3, 5))], 2)
        assert _fpmode.flushing()
    finally:
        _fpmode.restore_this_thread(saved)
    assert not _fpmode.flushing()


def test_the_mode_is_restored_when_a_compute_raises():
    with pytest.raises(KeyboardInterrupt):
        with ComputeFloatMode(2):
            assert _fpmode.flushing()
            raise KeyboardInterrupt
    assert not _fpmode.flushing()


class _Backend:
    n_threads = 2


def test_numpy_matmul_fallback_threads_follow_the_caller():
    """The product fallback (operands without a unit stride) runs on Python worker threads:
    each takes the calling thread's mode, so 1 and 2 threads agree."""
    x, y = _tiny((64, 40)), _tiny((40, 48))
    outs = [np.empty((64, 48), np.float32) for _ in range(4)]
    parts = [(x, y, o) for o in outs]
    step = linalg._numpy_step(_Backend(), parts, [])
    with ComputeFloatMode(2):
        step()
    assert not any(o.any() for o in outs)
    step()  # outside a compute: IEEE
    for o in outs:
        np.testing.assert_allclose(o, x @ y, rtol=1e-5, atol=0)
        assert (o > 0).all()


def test_setting_is_checked():
    with pytest.raises(ggopt.DTypeError, match="expected a bool"):
        ggopt.set_flush_denormals(1)  # type: ignore[arg-type]
    assert ggopt.get_flush_denormals()
