"""ggopt._kernels._gather against np.take."""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _gather as G
from ggopt.errors import ShapeError


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(
    "shard_nbytes,nshards_total,batch",
    [(3136, 2000, 500), (31360, 200, 50), (4, 1000, 333), (1, 97, 10), (40_000, 80, 40)],
)
def test_gather_matches_take(rng, shard_nbytes, nshards_total, batch, n_threads):
    src = rng.integers(0, 256, nshards_total * shard_nbytes, dtype=np.uint8)
    perm = rng.permutation(nshards_total).astype(np.int64)
    shards = src.reshape(nshards_total, shard_nbytes)
    for first in (0, nshards_total - batch, 3):
        dst = np.zeros(batch * shard_nbytes, np.uint8)
        G.gather_shards(src, dst, perm, first, batch, shard_nbytes, n_threads)
        expect = np.take(shards, perm[first : first + batch], axis=0)
        np.testing.assert_array_equal(dst.reshape(batch, shard_nbytes), expect)


def test_gather_float_data_through_byte_views(rng):
    images = rng.standard_normal((100, 784)).astype(np.float32)
    perm = rng.permutation(100).astype(np.int64)
    batch = np.empty((10, 784), np.float32)
    G.gather_shards(
        images.reshape(-1).view(np.uint8),
        batch.reshape(-1).view(np.uint8),
        perm,
        20,
        10,
        784 * 4,
        1,
    )
    np.testing.assert_array_equal(batch, images[perm[20:30]])


def test_gather_larger_dst_and_read_only_src(rng):
    src = rng.integers(0, 256, 64, dtype=np.uint8)
    src.setflags(write=False)
    perm = np.array([3, 1, 0, 2], np.int64)
    dst = np.full(40, 255, np.uint8)
    G.gather_shards(src, dst, perm, 1, 2, 16, 1)
    np.testing.assert_array_equal(dst[:32], np.concatenate([src[16:32], src[0:16]]))
    assert (dst[32:] == 255).all()


def test_gather_zero_bytes_and_zero_shards_are_no_ops():
    dst = np.full(8, 7, np.uint8)
    G.gather_shards(np.zeros(0, np.uint8), dst, np.arange(4, dtype=np.int64), 0, 4, 0, 2)
    G.gather_shards(np.zeros(16, np.uint8), dst, np.arange(4, dtype=np.int64), 4, 0, 4, 2)
    assert (dst == 7).all()


@pytest.mark.parametrize(
    "perm,first,nshards,dst_len,match",
    [
        ([0, 1, 9], 0, 3, 12, "perm\\[2\\] = 9"),
        ([0, -1], 0, 2, 8, "perm\\[1\\] = -1"),
        ([0, 1, 2], 2, 2, 8, "do not fit"),
        ([0, 1, 2], -1, 1, 8, "do not fit"),
        ([0, 1, 2], 0, 3, 11, "dst holds 11 bytes"),
    ],
)
def test_gather_errors_copy_nothing(perm, first, nshards, dst_len, match):
    src = np.arange(16, dtype=np.uint8)
    dst = np.full(dst_len, 200, np.uint8)
    with pytest.raises(ShapeError, match=match):
        G.gather_shards(src, dst, np.array(perm, np.int64), first, nshards, 4, 1)
    assert (dst == 200).all()
