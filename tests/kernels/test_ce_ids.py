"""ggopt._kernels._ce_ids (the cross-entropy on class ids) against float64 NumPy and against the
one-hot kernels of ggopt._kernels._softmax: the same bits, ignored rows exactly zero, the same
bits for 1 and 2 threads, views and in-place gradients, bad ids refused before anything is
written."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _ce_ids as C
from ggopt._kernels import _softmax as S
from ggopt.errors import InvalidValueError, ShapeError

IGNORE = -100
# (rows, classes): short rows (the one-hot kernel's block path), odd long rows, a tall batch
# above the parallel threshold, a wide vocabulary row (chunked exp sums)
SIZES = [(7, 13), (33, 301), (257, 10), (5, 4099), (3, 1)]


def batch(rng: np.random.Generator, nrows: int, ncols: int, frac_ignored: float = 0.3):
    logits = (rng.standard_normal((nrows, ncols)) * 4).astype(np.float32)
    ids = rng.integers(0, ncols, nrows).astype(np.int32)
    ids[rng.random(nrows) < frac_ignored] = IGNORE
    return logits, ids


def one_hot(ids: np.ndarray, ncols: int) -> np.ndarray:
    y = np.zeros((len(ids), ncols), np.float32)
    keep = np.flatnonzero(ids != IGNORE)
    y[keep, ids[keep]] = 1.0
    return y


def ref(logits: np.ndarray, ids: np.ndarray, grad: float) -> tuple[float, np.ndarray]:
    """float64 NumPy: the mean over all rows of -log_softmax at the id, ignored rows 0."""
    x = logits.astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    keep = ids != IGNORE
    loss = -lsm[np.flatnonzero(keep), ids[keep]].sum() / len(ids)
    d = (np.exp(lsm) - one_hot(ids, x.shape[1])) * (grad / len(ids))
    d[~keep] = 0
    return float(loss), d


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.int32)


@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_against_numpy_and_across_threads(rng, shape):
    logits, ids = batch(rng, *shape)
    want_loss, want_d = ref(logits, ids, 0.7)
    losses, grads = [], []
    for n_threads in (1, 2):
        losses.append(C.cross_entropy_loss_ids(logits, ids, IGNORE, n_threads))
        d = np.full_like(logits, np.nan)
        C.cross_entropy_loss_ids_back(0.7, logits, ids, d, IGNORE, n_threads)
        grads.append(d)
    np.testing.assert_allclose(losses[0], want_loss, rtol=1e-5)
    np.testing.assert_allclose(grads[0], want_d, rtol=1e-4, atol=1e-8)
    assert losses[0] == losses[1]
    np.testing.assert_array_equal(bits(grads[0]), bits(grads[1]))


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_equals_the_one_hot_kernels_bit_for_bit(rng, shape, n_threads):
    logits, ids = batch(rng, *shape)
    y = one_hot(ids, shape[1])
    assert (C.cross_entropy_loss_ids(logits, ids, IGNORE, n_threads)
            == S.cross_entropy_loss(logits, y, n_threads))
    got, want = np.empty_like(logits), np.empty_like(logits)
    C.cross_entropy_loss_ids_back(1.3, logits, ids, got, IGNORE, n_threads)
    S.cross_entropy_loss_back(1.3, logits, y, want, n_threads)
    kept = ids != IGNORE
    np.testing.assert_array_equal(bits(got[kept]), bits(want[kept]))


def test_ignored_rows_add_nothing_and_get_exactly_zero(rng):
    logits, ids = batch(rng, 40, 300, frac_ignored=0.5)
    ids[0] = IGNORE
    kept = ids != IGNORE
    d = np.full_like(logits, np.nan)
    C.cross_entropy_loss_ids_back(1.0, logits, ids, d, IGNORE, 2)
    np.testing.assert_array_equal(bits(d[~kept]), 0)  # +0.0, not -0.0
    # changing an ignored row's logits changes neither the loss nor any other gradient row
    loss = C.cross_entropy_loss_ids(logits, ids, IGNORE, 2)
    other = logits.copy()
    other[~kept] = 1e4
    assert C.cross_entropy_loss_ids(other, ids, IGNORE, 2) == loss
    d2 = np.empty_like(logits)
    C.cross_entropy_loss_ids_back(1.0, other, ids, d2, IGNORE, 2)
    np.testing.assert_array_equal(bits(d2), bits(d))
    # every row ignored: loss 0 (divided by all rows), gradient 0
    none = np.full_like(ids, IGNORE)
    assert C.cross_entropy_loss_ids(logits, none, IGNORE, 1) == 0.0
    C.cross_entropy_loss_ids_back(1.0, logits, none, d, IGNORE, 1)
    assert not d.any()


def test_a_real_class_as_the_ignore_id(rng):
    logits, ids = batch(rng, 9, 6, frac_ignored=0.0)
    ids[::2] = 0
    y = one_hot(ids, 6)
    y[ids == 0] = 0
    assert C.cross_entropy_loss_ids(logits, ids, 0, 1) == S.cross_entropy_loss(logits, y, 1)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_views_and_in_place(rng, n_threads):
    logits, ids = batch(rng, 31, 257)
    loss = C.cross_entropy_loss_ids(logits, ids, IGNORE, n_threads)
    d = np.empty_like(logits)
    C.cross_entropy_loss_ids_back(0.5, logits, ids, d, IGNORE, n_threads)
    # strided elements (a transposed array), padded rows, a read-only array
    fortran = np.asfortranarray(logits)
    padded = np.zeros((31, 300), np.float32)
    padded[:, :257] = logits
    readonly = logits.copy()
    readonly.flags.writeable = False
    for view in (fortran, padded[:, :257], readonly):
        assert C.cross_entropy_loss_ids(view, ids, IGNORE, n_threads) == loss
        got = np.empty_like(logits)
        C.cross_entropy_loss_ids_back(0.5, view, ids, got, IGNORE, n_threads)
        np.testing.assert_array_equal(bits(got), bits(d))
    # the gradient written over the logits themselves, into padded rows of a bigger array
    inplace = logits.copy()
    C.cross_entropy_loss_ids_back(0.5, inplace, ids, inplace, IGNORE, n_threads)
    np.testing.assert_array_equal(bits(inplace), bits(d))
    out = np.full((31, 300), 7.0, np.float32)
    C.cross_entropy_loss_ids_back(0.5, logits, ids, out[:, :257], IGNORE, n_threads)
    np.testing.assert_array_equal(bits(out[:, :257]), bits(d))
    assert (out[:, 257:] == 7.0).all()
    # ids from a strided view
    wide = np.stack([ids, ids]).T.copy()
    assert C.cross_entropy_loss_ids(logits, wide[:, 0], IGNORE, n_threads) == loss


@pytest.mark.parametrize("bad", [6, -1, 2**31 - 1, -(2**31)])
def test_bad_ids_are_refused_before_anything_is_written(rng, bad):
    logits, ids = batch(rng, 5, 6, frac_ignored=0.0)
    ids[3] = bad
    d = np.full_like(logits, 9.0)
    with pytest.raises(InvalidValueError, match=rf"row 3 is {bad}, out of range.*\[0, 6\).*-100"):
        C.cross_entropy_loss_ids(logits, ids, IGNORE, 2)
    with pytest.raises(InvalidValueError, match="cross_entropy_loss_ids_back: the label id of "
                                                "row 3"):
        C.cross_entropy_loss_ids_back(1.0, logits, ids, d, IGNORE, 2)
    assert (d == 9.0).all()


def test_shape_errors(rng):
    logits, ids = batch(rng, 5, 6)
    with pytest.raises(ShapeError, match="4 label ids for 5 rows"):
        C.cross_entropy_loss_ids(logits, ids[:4], IGNORE, 1)
    with pytest.raises(ShapeError, match="at least one row"):
        C.cross_entropy_loss_ids(logits[:0], ids[:0], IGNORE, 1)
    with pytest.raises(ShapeError, match=r"dst must have the logits' shape \(5, 6\)"):
        C.cross_entropy_loss_ids_back(1.0, logits, ids, np.empty((5, 7), np.float32), IGNORE, 1)
    with pytest.raises(ShapeError, match="dst rows must be contiguous"):
        C.cross_entropy_loss_ids_back(1.0, logits, ids, np.empty((6, 5), np.float32).T, IGNORE,
                                      1)
    with pytest.raises(InvalidValueError, match="n_threads"):
        C.cross_entropy_loss_ids(logits, ids, IGNORE, 0)
