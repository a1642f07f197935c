"""GemmPlan's dot-product path (``_kernels/_gemm.pyx``, ``ggopt_dot_rows``): products of at most
DOT_MAX_ROWS rows (one token's activations) against a weight stored row by row, cut into blocks
of output columns shared out over the threads. Every output is its documented sum (16 running
sums by ``k % 16``, then added pairwise), so its bits depend on nothing but its row and ``x``:
not the thread count, the block, the rows around it, the register layout (16-lane vectors with
AVX-512, 8-lane halves without: both forced on any CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from ggopt._kernels._gemm import GemmPlan

from ggopt._kernels import _gemm
from ggopt.backend.cpu.blas import SerialBlas, products_blas

DOT_MAX_ROWS = 4  # _gemm.pyx's default, restored after each test that changes it


@pytest.fixture(autouse=True)
def _chosen_blas():
    products_blas()
    yield
    _gemm.set_narrow_tiles(None)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _weight(c, k, layout, seed):
    """y (k, c) stored as the rows of a (c, k) weight: its transpose, or a strided one."""
    if layout == "t":
        return _rand((c, k), seed).T
    return _rand((c + 2, k + 9), seed)[1:c + 1, 3:k + 3].T  # row stride k + 9


def _x(r, k, layout, seed):
    if layout == "c":
        return _rand((r, k), seed)
    return _rand((r + 1, 2 * k + 3), seed)[1:, 1:k + 1]  # rows strided, unit columns


def _dot_order(x, y):
    """What ggopt_dot_rows computes, in NumPy float32: element i of each row's products goes
    to running sum ``i % 16`` (in order of i), then the 16 sums are added pairwise."""
    r, k = x.shape
    c = y.shape[1]
    out = np.empty((r, c), np.float32)
    pad = (-k) % 16
    for i in range(r):
        prod = np.concatenate([y.T * x[i], np.zeros((c, pad), np.float32)], axis=1)
        sums = np.zeros((c, 16), np.float32)
        for i0 in range(0, k + pad, 16):
            sums += prod[:, i0:i0 + 16]
        width = 8
        while width:
            sums[:, :width] += sums[:, width:2 * width]
            width //= 2
        out[i] = sums[:, 0]
    return out


def _run(x, y, n_threads, acc=None):
    out = np.full((x.shape[0], y.shape[1]), np.nan, np.float32)
    plan = GemmPlan()
    assert plan.add(x, y, out, acc)
    assert plan.n_dot == 1
    with SerialBlas():
        plan.run(n_threads)
    return out


@pytest.mark.parametrize("narrow", [False, True], ids=["v16", "halves"])
@pytest.mark.parametrize("layout", ["t", "s"])
@pytest.mark.parametrize("x_layout", ["c", "s"])
@pytest.mark.parametrize("shape", [(1, 2, 5), (1, 16, 4), (1, 17, 3), (2, 33, 7), (3, 64, 9),
                                   (4, 579, 37), (1, 1536, 1001)])
def test_dot_products_are_their_documented_sums_bit_for_bit(layout, x_layout, shape, narrow):
    assert _gemm.set_narrow_tiles(narrow) is narrow
    r, k, c = shape
    x, y = _x(r, k, x_layout, 1), _weight(c, k, layout, 2)
    out = _run(x, y, 2)
    np.testing.assert_array_equal(out, _dot_order(x, y))
    want = x.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4 * np.sqrt(k))


def test_thread_count_never_changes_bits():
    x, y = _rand((1, 300), 3), _weight(5003, 300, "s", 4)  # 46 blocks of 108 columns
    outs = [_run(x, y, n) for n in (1, 2, 3, 7)]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_an_output_does_not_depend_on_the_columns_around_it():
    """The columns 5..16 alone (other blocks, other groups of four rows) give the same bits."""
    x, y = _rand((1, 700), 5), _weight(2000, 700, "t", 6)
    whole = _run(x, y, 2)
    np.testing.assert_array_equal(_run(x, y[:, 5:17], 1), whole[:, 5:17])
    np.testing.assert_array_equal(_run(x, y[:, 1995:], 2), whole[:, 1995:])


def test_product_then_add_on_the_dot_path():
    x, y = _rand((2, 130), 7), _weight(900, 130, "t", 8)
    acc = _rand((2, 900 + 5), 9)[:, 2:902]  # a strided accumulator
    start = acc.copy()
    out = _run(x, y, 2, acc)
    np.testing.assert_array_equal(out, _run(x, y, 1))
    np.testing.assert_array_equal(acc, start + out)


def test_which_products_take_the_dot_path():
    y = _weight(40, 20, "t", 10)
    cases = [(_rand((DOT_MAX_ROWS, 20), 11), y, 1),          # few rows, weight rows contiguous
             (_rand((DOT_MAX_ROWS + 1, 20), 12), y, 0),      # more rows: sgemm
             (_rand((1, 20), 13), _rand((20, 40), 14), 0),  # y with contiguous rows: sgemm
             (_rand((1, 0), 15), np.empty((0, 40), np.float32).T.copy().T, 0)]  # empty sum
    for x, yy, n_dot in cases:
        plan = GemmPlan()
        assert plan.add(x, yy, np.empty((x.shape[0], 40), np.float32))
        assert plan.n_dot == n_dot, (x.shape, yy.strides)
    _gemm.set_dot_rows(0)
    try:
        plan = GemmPlan()
        assert plan.add(cases[0][0], y, np.empty((DOT_MAX_ROWS, 40), np.float32))
        assert plan.n_dot == 0
    finally:
        _gemm.set_dot_rows(DOT_MAX_ROWS)


def test_dot_and_sgemm_products_in_one_plan():
    """A plan mixing both kinds (attention heads beside a batched product) runs each right."""
    x1, y1 = _rand((1, 64), 16), _weight(50, 64, "s", 17)
    x2, y2 = _rand((30, 64), 18), _rand((64, 20), 19)
    o1, o2 = np.empty((1, 50), np.float32), np.empty((30, 20), np.float32)
    plan = GemmPlan()
    assert plan.add(x1, y1, o1) and plan.add(x2, y2, o2)
    assert plan.n_dot == 1 and plan.n_items == 2
    with SerialBlas():
        plan.run(2)
    np.testing.assert_array_equal(o1, _dot_order(x1, y1))
    np.testing.assert_allclose(o2, x2 @ y2, rtol=1e-5, atol=1e-5)
