"""ThinPlan (``_kernels/_thin.pyx``): products with a side of at most 16 on ggopt's own
kernels. Each output is its documented sum (rows form: k ascending from 0; dots form: 16
running sums by ``k % 16`` added pairwise), checked bit for bit against that order in NumPy
float32, to float tolerance against float64, and identical for 1, 2, 3 threads, any cut of
the work and either register tiling (AVX-512's wide tiles, AVX2's narrow ones: both run on any
CPU); ``acc += x @ y`` adds each sum once and leaves ``out`` alone."""

from __future__ import annotations

import numpy as np
import pytest
from ggopt._kernels._thin import ThinPlan

from ggopt._kernels import _thin
from ggopt.errors import InvalidValueError, ShapeError


@pytest.fixture(autouse=True)
def _defaults():
    yield
    _thin.set_parallel_min(None)
    _thin.set_block_macs(1 << 19)
    _thin.set_narrow_tiles(None)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _layout(a, how, seed):
    """``a``'s values in a view with other strides: "c" as given, "t" stored transposed,
    "s" rows and columns strided inside a larger array."""
    if how == "c":
        return a.copy()
    if how == "t":
        return np.ascontiguousarray(a.T).T
    big = _rand((2 * a.shape[0] + 1, 3 * a.shape[1] + 2), seed)
    big[1::2, 2::3] = a
    return big[1::2, 2::3]


def _rows_order(x, y):
    """out[i, j] = x[i,0] y[0,j] + x[i,1] y[1,j] + ... in float32, k ascending."""
    out = np.zeros((x.shape[0], y.shape[1]), np.float32)
    for k in range(x.shape[1]):
        out += np.outer(x[:, k], y[k]).astype(np.float32)
    return out


def _dots_order(x, y):
    """Element k of each dot product to running sum k % 16, then the sums added pairwise."""
    r, k = x.shape
    pad = (-k) % 16
    xp = np.concatenate([x, np.zeros((r, pad), np.float32)], axis=1)
    yp = np.concatenate([y, np.zeros((pad, y.shape[1]), np.float32)], axis=0)
    sums = np.zeros((r, y.shape[1], 16), np.float32)
    for i0 in range(0, k + pad, 16):
        sums += xp[:, None, i0:i0 + 16] * yp[i0:i0 + 16].T[None]
    width = 8
    while width:
        sums[..., :width] += sums[..., width:2 * width]
        width //= 2
    return sums[..., 0]


# (r, k, c, x layout, y layout, the form ThinPlan picks)
CASES = [
    (37, 53, 5, "c", "t", "dots"),            # A x: x rows and A's rows along k
    (37, 53, 5, "c", "c", "dots+packed"),     # B^T dy: y's columns strided
    (6, 41, 35, "t", "c", "rows"),            # dh^T x: y rows unit stride
    (33, 7, 45, "c", "c", "rows"),            # dh A, k short
    (33, 7, 45, "c", "t", "rows+packed"),     # B h: y = B^T
    (45, 41, 6, "t", "c", "rows^T"),          # dy^T h: out^T from y^T's rows
    (20, 11, 16, "s", "s", "rows+packed"),    # strided views both sides
    (8, 40, 30, "t", "t", "dots+packed^T"),   # out^T = y^T x^T, x^T copied
    (1, 1, 1, "c", "c", "dots"),
    (16, 300, 16, "c", "t", "dots"),
    (260, 9, 1029, "c", "t", "rows+packed"),  # many blocks, a partial last vector
    (9, 530, 17, "t", "c", "rows"),           # chunks of 8 k and a partial one
]


@pytest.mark.parametrize("narrow", [False, True], ids=["wide-tiles", "narrow-tiles"])
@pytest.mark.parametrize("r, k, c, lx, ly, form", CASES, ids=str)
def test_each_form_is_its_documented_sum_for_any_threads_and_cut(r, k, c, lx, ly, form,
                                                                 narrow):
    assert _thin.set_narrow_tiles(narrow) is narrow
    xv, yv = _rand((r, k), 1), _rand((k, c), 2)
    x, y = _layout(xv, lx, 3), _layout(yv, ly, 4)
    transposed = form.endswith("^T")
    order = _dots_order if form.startswith("dots") else _rows_order
    want = order(yv.T, xv.T).T if transposed else order(xv, yv)
    np.testing.assert_allclose(want, xv.astype(np.float64) @ yv, rtol=1e-4, atol=1e-4)
    results = []
    for block_macs in (1 << 19, 37):
        _thin.set_block_macs(block_macs)
        out = np.full((r, c), np.nan, np.float32)
        plan = ThinPlan()
        assert plan.add(x, y, out)
        assert plan.forms() == [form]
        _thin.set_parallel_min(0)
        for n_threads in (1, 2, 3):
            out[...] = np.nan
            plan.run(n_threads)
            results.append(out.copy())
    assert all(np.array_equal(res, want) for res in results)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4], CASES[5]], ids=str)
def test_acc_adds_each_sum_once_and_leaves_out_alone(case):
    r, k, c, lx, ly, form = case
    xv, yv = _rand((r, k), 5), _rand((k, c), 6)
    acc0 = _rand((r, c), 7)
    order = _dots_order if form.startswith("dots") else _rows_order
    s = order(yv.T, xv.T).T if form.endswith("^T") else order(xv, yv)
    out = np.full((r, c), 7.0, np.float32)
    acc = _layout(acc0, "t", 8)  # the accumulator may have any strides
    plan = ThinPlan()
    assert plan.add(_layout(xv, lx, 9), _layout(yv, ly, 10), out, acc)
    _thin.set_parallel_min(0)
    plan.run(2)
    assert np.array_equal(acc, acc0 + s)
    assert np.all(out == 7.0)


def test_empty_sides():
    x, y = _rand((5, 0), 1), _rand((0, 3), 2)
    out = np.full((5, 3), np.nan, np.float32)
    acc = np.full((5, 3), -0.0, np.float32)
    plan = ThinPlan()
    assert plan.add(x, y, out) and plan.add(x, y, np.empty((5, 3), np.float32), acc)
    assert plan.add(_rand((0, 4), 3), _rand((4, 2), 4), np.empty((0, 2), np.float32))
    plan.run(2)
    assert np.array_equal(out, np.zeros((5, 3), np.float32))
    assert not np.any(np.signbit(acc))  # -0 + 0: acc + the empty sum, as an add would give


def test_what_it_leaves_to_gemm_plan():
    plan = ThinPlan()
    assert not plan.add(_rand((20, 17), 1), _rand((17, 30), 2), np.empty((20, 30), np.float32))
    # one token against a weight stored row by row: GemmPlan's dot-product kernel
    w = _rand((100, 40), 3)
    assert not plan.add(_rand((1, 40), 4), w.T, np.empty((1, 100), np.float32))
    # small operands that neither form reads in place, in neither orientation
    assert not plan.add(_rand((40, 8), 5).T, _layout(_rand((40, 8), 6), "t", 0),
                        np.empty((8, 8), np.float32))
    x = _rand((6, 5), 7)[::-1]  # a negative stride
    assert not plan.add(x, _rand((5, 3), 8), np.empty((6, 3), np.float32))
    assert plan.n_items == 0


def test_refusals():
    plan = ThinPlan()
    with pytest.raises(ShapeError, match="does not give out"):
        plan.add(_rand((3, 4), 1), _rand((5, 2), 2), np.empty((3, 2), np.float32))
    with pytest.raises(ShapeError, match="acc"):
        plan.add(_rand((3, 4), 1), _rand((4, 2), 2), np.empty((3, 2), np.float32),
                 np.empty((2, 3), np.float32))
    with pytest.raises(InvalidValueError, match="n_threads"):
        plan.run(0)
    assert plan.n_items == 0
