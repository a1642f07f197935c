"""ggopt._kernels._reduce against NumPy: sums, repeat and repeat_back, argmax, count_equal."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _reduce as R
from ggopt.errors import ShapeError
from tests.support.helpers import layout
from tests.support.sizes import KERNEL_BIG

SHAPE = (7, 13, 3, 5)
BIG = KERNEL_BIG  # 270,000 elements: enough for the kernels to start threads
THREADS = [1, 2]


LAYOUTS = ["contiguous", "strided", "permuted", "reversed", "readonly"]


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG, (1, 1, 1, 300_000)])
def test_sum_rows(rng, shape, n_threads):
    a = rng.standard_normal(shape).astype(np.float32)
    expect = a.astype(np.float64).sum(axis=-1, keepdims=True)
    for la in LAYOUTS:
        ld = "strided" if la == "permuted" else "contiguous"
        dst = layout(np.zeros(shape[:3] + (1,), np.float32), ld)
        R.sum_rows(layout(a, la), dst, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=1e-6, atol=1e-6)


def test_sum_rows_errors_and_empty_rows(rng):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    two_wide = np.full((7, 13, 3, 2), 7, np.float32)
    with pytest.raises(ShapeError, match="last dim of 1"):
        R.sum_rows(a, two_wide, 1)
    np.testing.assert_array_equal(two_wide, 7)
    dst = np.full((2, 1, 3, 1), 9, np.float32)
    R.sum_rows(np.zeros((2, 1, 3, 0), np.float32), dst, 1)
    np.testing.assert_array_equal(dst, 0)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG, (1, 1, 1, 300_001)])
def test_sum_all(rng, shape, n_threads):
    a = rng.standard_normal(shape).astype(np.float32)
    expect = a.astype(np.float64).sum()
    for la in LAYOUTS:
        got = R.sum_all(layout(a, la), n_threads)
        assert isinstance(got, float)
        assert float(np.float32(got)) == got  # rounded to float32
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-4)
    assert R.sum_all(np.zeros((0, 2, 3, 4), np.float32), n_threads) == 0.0


def test_sum_all_is_double_accumulated():
    # 2^24 + many ones: a float accumulator would get stuck at 2^24
    a = np.ones((1, 1, 1, 4097), np.float32)
    a[0, 0, 0, 0] = 2.0**24
    assert R.sum_all(a, 1) == 2.0**24 + 4096


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize(
    "sshape,dshape",
    [
        ((1, 1, 1, 5), (7, 13, 3, 5)),
        ((7, 13, 3, 1), (7, 13, 3, 5)),
        ((1, 13, 1, 5), (2, 13, 3, 10)),
        ((2, 3, 1, 25), BIG),
        (SHAPE, SHAPE),
    ],
)
def test_repeat(rng, sshape, dshape, n_threads):
    src = rng.standard_normal(sshape).astype(np.float32)
    expect = np.tile(src, tuple(d // s for d, s in zip(dshape, sshape, strict=True)))
    for ls, ld in [("contiguous", "contiguous"), ("strided", "permuted"), ("readonly", "reversed")]:
        dst = layout(np.zeros(dshape, np.float32), ld)
        R.repeat(layout(src, ls), dst, n_threads)
        np.testing.assert_array_equal(dst, expect)


def test_repeat_in_place_same_shape(rng):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    x = a.copy()
    R.repeat(x, x, 1)
    np.testing.assert_array_equal(x, a)


def repeat_back_ref(src: np.ndarray, dshape: tuple[int, ...]) -> np.ndarray:
    reps = [s // d for s, d in zip(src.shape, dshape, strict=True)]
    split = []
    for r, d in zip(reps, dshape, strict=True):
        split += [r, d]
    return src.astype(np.float64).reshape(split).sum(axis=(0, 2, 4, 6))


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize(
    "sshape,dshape",
    [
        ((7, 13, 3, 5), (1, 1, 1, 5)),  # bias gradient
        ((7, 13, 3, 5), (7, 13, 3, 1)),
        ((2, 13, 3, 10), (1, 13, 1, 5)),
        (BIG, (2, 3, 1, 25)),
        ((1, 1, 500, 10), (1, 1, 1, 10)),
        ((1, 1, 4, 70_001), (1, 1, 1, 70_001)),
        (SHAPE, SHAPE),
    ],
)
def test_repeat_back(rng, sshape, dshape, n_threads):
    src = rng.standard_normal(sshape).astype(np.float32)
    expect = repeat_back_ref(src, dshape)
    ntiles = np.prod(sshape) // np.prod(dshape)  # float32 sums (ggml's) of this many terms
    for ls, ld in [("contiguous", "contiguous"), ("strided", "permuted"), ("reversed", "strided")]:
        dst = layout(np.full(dshape, 123.0, np.float32), ld)  # overwritten, not accumulated
        R.repeat_back(layout(src, ls), dst, n_threads)
        np.testing.assert_allclose(dst, expect, rtol=1e-5, atol=1e-6 * ntiles)


@pytest.mark.parametrize("sshape", [(1, 1, 2048, 128), (1, 1, 500, 500), (3, 2, 77, 129),
                                    (1, 1, 1, 70)])
def test_repeat_back_into_one_row_sums_rows_in_order(rng, sshape):
    """A norm-weight or bias gradient (dst one row of src's length): each column is the float32
    sum of the rows in order (ggml's order, the bits of the general path), for 1, 2 and 3
    threads; also with rows spaced apart (a column slice)."""
    wide = rng.standard_normal(sshape[:3] + (sshape[3] + 9,)).astype(np.float32)
    for src in (np.ascontiguousarray(wide[..., :sshape[3]]), wide[..., 3:3 + sshape[3]]):
        rows = src.reshape(-1, sshape[3])
        expect = rows[0].copy()
        for r in rows[1:]:
            expect = expect + r  # float32, row by row
        for n in (1, 2, 3):
            dst = np.full((1, 1, 1, sshape[3]), 123.0, np.float32)
            R.repeat_back(src, dst, n)
            np.testing.assert_array_equal(dst[0, 0, 0], expect)


@pytest.mark.parametrize("sshape", [(37, 8, 28, 28), (500, 3, 6, 4), (2, 5, 30, 30)])
def test_repeat_back_into_channels_does_not_depend_on_the_thread_count(rng, sshape):
    """A conv bias gradient (dst ne0 == 1): the same bits on 1, 2 and 3 threads, contiguous
    (whole planes summed at once) or strided (row by row)."""
    src = rng.standard_normal(sshape).astype(np.float32)
    dshape = (1, sshape[1], 1, 1)
    for view in (src, layout(src, "strided")):
        outs = []
        for n in (1, 2, 3):
            dst = np.full(dshape, 123.0, np.float32)
            R.repeat_back(view, dst, n)
            outs.append(dst)
        for other in outs[1:]:
            np.testing.assert_array_equal(outs[0], other)
        np.testing.assert_allclose(outs[0], repeat_back_ref(src, dshape), rtol=1e-6,
                                   atol=1e-6 * src.size)


def test_repeat_and_repeat_back_errors(rng):
    a = rng.standard_normal(SHAPE).astype(np.float32)
    dst = np.full((1, 1, 1, 2), 5, np.float32)
    with pytest.raises(ShapeError, match="divide"):
        R.repeat_back(a, dst, 1)
    not_tiled = np.full((7, 13, 3, 7), 5, np.float32)
    with pytest.raises(ShapeError, match="divide"):
        R.repeat(a, not_tiled, 1)
    np.testing.assert_array_equal(dst, 5)
    np.testing.assert_array_equal(not_tiled, 5)


def argmax_ref(a: np.ndarray) -> np.ndarray:
    # the last index of the maximum
    return a.shape[1] - 1 - np.argmax(a[:, ::-1], axis=1)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [(37, 11), (500, 10), (21_000, 13)])
def test_argmax(rng, shape, n_threads):
    a = rng.integers(-3, 4, shape).astype(np.float32)  # many ties
    expect = argmax_ref(a)
    for view in (a, np.ascontiguousarray(a.T).T, np.pad(a, ((0, 0), (0, 3)))[:, :-3]):
        dst = np.full(shape[0], -1, np.int32)
        R.argmax(view, dst, n_threads)
        np.testing.assert_array_equal(dst, expect)
    dst = np.zeros(shape[0] // 2 + shape[0] % 2, np.int32)
    R.argmax(a[::2, ::-1], dst, n_threads)
    np.testing.assert_array_equal(dst, argmax_ref(a[::2, ::-1]))


def test_argmax_ties_and_infinities():
    a = np.array([[1, 3, 3, 2], [5, 5, 5, 5], [-np.inf] * 4, [0, 1, 0, 1]], np.float32)
    dst = np.empty(4, np.int32)
    R.argmax(a, dst, 1)
    np.testing.assert_array_equal(dst, [2, 3, 3, 3])


def test_argmax_nan_rows_keep_ggmls_sequential_rule(rng):
    # contiguous rows without NaN take a two-pass vector path; rows with a NaN the sequential
    # definition (the running maximum restarts after a NaN): both against a Python loop
    def ref(row):
        m, idx = -np.inf, 0
        for i, v in enumerate(row):
            m = m if m > v else v
            if m == v:
                idx = i
        return idx

    a = rng.integers(-3, 4, (64, 37)).astype(np.float32)
    a[::3, rng.integers(0, 37, 22)] = np.nan
    a[5] = np.nan
    a[7, :5] = [np.inf, -np.inf, np.nan, -0.0, 0.0]
    for view in (a, np.ascontiguousarray(a.T).T):
        dst = np.empty(64, np.int32)
        R.argmax(view, dst, 2)
        np.testing.assert_array_equal(dst, [ref(r) for r in a])


def test_argmax_errors():
    short, wide_ints = np.full(2, 7, np.int32), np.full(3, 7, np.int64)
    with pytest.raises(ShapeError, match="one entry per row"):
        R.argmax(np.zeros((3, 4), np.float32), short, 1)
    with pytest.raises(ValueError):
        R.argmax(np.zeros((3, 4), np.float32), wide_ints, 1)
    assert (short == 7).all() and (wide_ints == 7).all()


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("shape", [SHAPE, BIG])
def test_count_equal(rng, shape, n_threads):
    a = rng.integers(0, 3, shape).astype(np.int32)
    b = rng.integers(0, 3, shape).astype(np.int32)
    expect = int((a == b).sum())
    for la, lb in [("contiguous", "contiguous"), ("strided", "permuted"), ("reversed", "readonly")]:
        got = R.count_equal(layout(a, la), layout(b, lb), n_threads)
        assert got == expect and isinstance(got, int)
    with pytest.raises(ShapeError, match="same shape"):
        R.count_equal(a, b[:1], n_threads)
