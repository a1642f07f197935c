"""The strided copy kernel (cont / dup / same-type cpy) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from ggopt._kernels._copy import copy

from ggopt.errors import DTypeError, ShapeError


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_copy_permuted_and_strided(dtype, n_threads):
    rng = np.random.default_rng(0)
    base = (rng.standard_normal((5, 7, 33, 65)) * 100).astype(dtype)
    for src in (base, base.transpose(1, 2, 0, 3), base.transpose(3, 1, 2, 0),
                base[:, ::2, 1::3, ::-2]):
        dst = np.full(src.shape, 7, dtype=dtype)
        copy(src, dst, n_threads)
        np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.int64])
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("shape", [(3, 2, 37, 70), (1, 1, 16, 16), (1, 1, 2, 1000),
                                   (2, 1, 300, 5)])
def test_copy_of_a_transpose(dtype, n_threads, shape):
    # the source contiguous along axis 2 and the destination along axis 3: 4-byte elements
    # take the tiled path (tiles of 16, with partial tiles at the edges)
    rng = np.random.default_rng(1)
    base = (rng.standard_normal(shape[:2] + shape[:1:-1]) * 100).astype(dtype)
    for src in (base.swapaxes(2, 3), base[:, :, ::-1].swapaxes(2, 3),
                np.ascontiguousarray(base.transpose(1, 0, 2, 3)).transpose(1, 0, 3, 2)):
        dst = np.full(src.shape, 7, dtype=dtype)
        copy(src, dst, n_threads)
        np.testing.assert_array_equal(dst, src)
    big = np.zeros(shape[:3] + (2 * shape[3],), dtype)
    copy(base.swapaxes(2, 3), big[..., ::2], n_threads)  # a strided destination row
    np.testing.assert_array_equal(big[..., ::2], base.swapaxes(2, 3))
    assert not big[..., 1::2].any()


def test_copy_into_strided_destination_keeps_the_rest():
    src = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    big = np.zeros((2, 3, 4, 10), np.float32)
    copy(src, big[..., ::2], 2)
    np.testing.assert_array_equal(big[..., ::2], src)
    assert not big[..., 1::2].any()


def test_copy_preserves_negative_zero_and_nan_bits():
    src = np.array([-0.0, np.nan, np.inf, -1.5], np.float32).reshape(1, 1, 1, 4)
    dst = np.zeros_like(src)
    copy(src, dst, 1)
    assert dst.tobytes() == src.tobytes()


def test_copy_rejects_mismatches():
    a = np.ones((1, 1, 2, 3), np.float32)
    transposed = np.full((1, 1, 3, 2), 7, np.float32)
    ints = np.full((1, 1, 2, 3), 7, np.int32)
    three_d = np.full((1, 2, 3), 7, np.float32)
    with pytest.raises(ShapeError):
        copy(a, transposed, 1)
    with pytest.raises(DTypeError):
        copy(a, ints, 1)
    with pytest.raises(ShapeError):
        copy(a[0], three_d, 1)
    for dst in (transposed, ints, three_d):
        assert (dst == 7).all()
    assert (a == 1).all()
