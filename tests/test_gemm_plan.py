"""GemmPlan (``_kernels/_gemm.pyx``): one-thread sgemm calls over fixed pieces, any strides
BLAS reads in place, NumPy's matmul as the reference."""

from __future__ import annotations

import numpy as np
import pytest
from ggopt._kernels._gemm import GemmPlan

from ggopt.backend.blas import SerialBlas
from ggopt.errors import InvalidValueError, ShapeError


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _operand(shape, layout, seed):
    """A (rows, cols) float32 view: C order, a transpose (F order), or a strided slice."""
    r, c = shape
    if layout == "c":
        return _rand(shape, seed)
    if layout == "t":
        return _rand((c, r), seed).T
    return _rand((r + 3, 2 * c + 5), seed)[1:r + 1, 2:2 + c]  # row stride 2c+5, unit columns


@pytest.mark.parametrize("lx", ["c", "t", "s"])
@pytest.mark.parametrize("ly", ["c", "t", "s"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (33, 1, 17), (1, 19, 4), (64, 130, 9)])
def test_products_match_numpy(lx, ly, shape):
    r, k, c = shape
    x, y = _operand((r, k), lx, 1), _operand((k, c), ly, 2)
    out = np.full((r, c), np.nan, np.float32)
    plan = GemmPlan()
    assert plan.add(x, y, out)
    with SerialBlas():
        plan.run(2)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_accumulate_and_split_k_sums():
    x, y = _rand((9, 40), 3), _rand((40, 6), 4)
    out, part = _rand((9, 6), 5), np.empty((9, 6), np.float32)
    start = out.copy()
    plan = GemmPlan()
    assert plan.add(x[:, :20], y[:20], out, accumulate=True)
    assert plan.add(x[:, 20:], y[20:], part)
    plan.add_sum(out.reshape(-1), part.reshape(-1))
    with SerialBlas():
        plan.run(3)
    np.testing.assert_allclose(out, start + x @ y, rtol=1e-5, atol=1e-5)


def test_empty_reduction_zeroes_or_keeps():
    x, y = np.empty((4, 0), np.float32), np.empty((0, 3), np.float32)
    zero, keep = np.ones((4, 3), np.float32), np.ones((4, 3), np.float32)
    plan = GemmPlan()
    assert plan.add(x, y, zero) and plan.add(x, y, keep, accumulate=True)
    plan.run(1)
    assert (zero == 0).all() and (keep == 1).all()


def test_layouts_blas_cannot_read_are_refused_untouched():
    x = _rand((6, 8), 6)[:, ::2]  # no unit stride
    y, out = _rand((4, 5), 7), np.empty((6, 5), np.float32)
    plan = GemmPlan()
    assert not plan.add(x, y, out)
    assert plan.n_items == 0
    unaligned = np.frombuffer(np.zeros(4 * 24 + 1, np.uint8).data, np.uint8)[1:].view(np.float32)
    assert not plan.add(unaligned.reshape(4, 6)[:, ::2], _rand((3, 2), 8),
                        np.empty((4, 2), np.float32))


def test_thread_count_never_changes_bits():
    x, y = _rand((300, 257), 9), _rand((257, 131), 10)
    outs = []
    for n in (1, 2, 3, 7):
        out = np.empty((300, 131), np.float32)
        plan = GemmPlan()
        for r0, r1 in ((0, 150), (150, 300)):
            assert plan.add(x[r0:r1], y, out[r0:r1])
        with SerialBlas():
            plan.run(n)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_bad_arguments():
    plan = GemmPlan()
    with pytest.raises(ShapeError, match="does not give"):
        plan.add(_rand((3, 4), 1), _rand((5, 2), 2), np.empty((3, 2), np.float32))
    with pytest.raises(ShapeError, match="elements"):
        plan.add_sum(np.empty(3, np.float32), np.empty(4, np.float32))
    with pytest.raises(InvalidValueError, match="n_threads"):
        plan.run(0)
    with pytest.raises(ValueError):  # a read-only output
        ro = np.empty((3, 2), np.float32)
        ro.flags.writeable = False
        plan.add(_rand((3, 4), 1), _rand((4, 2), 2), ro)
