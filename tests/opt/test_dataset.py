"""Datasets: ggml's test_dataset plus typed storage, host batches and shuffling details."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.errors import ShapeError
from tests.support.opt_fixture import NDATA, make_ctx_data, make_supervised

# ggml's test_dataset runs every (shard size, batch size) pair up to NDATA where the batch is a
# whole number of shards; the other pairs must be rejected.
SHARD_BATCH = [(s, b) for s in range(1, 7) for b in range(1, 7) if b % s == 0]
NOT_WHOLE_SHARDS = [(s, b) for s in range(1, 7) for b in range(1, 7) if b % s != 0]


def _batch_tensors(ndata_batch: int):
    ctx = ggopt.Context()
    data_batch = ctx.new_tensor_1d(ggopt.F32, 2 * ndata_batch)
    labels_batch = ctx.new_tensor_1d(ggopt.F32, ndata_batch)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    return data_batch, labels_batch


@pytest.mark.parametrize("ndata_shard, ndata_batch", NOT_WHOLE_SHARDS)
def test_batch_of_partial_shards_is_rejected(ndata_shard, ndata_batch):
    ds = make_supervised(ndata_shard)
    data_before, labels_before = ds.data.numpy().copy(), ds.labels.numpy().copy()
    data_batch, labels_batch = _batch_tensors(ndata_batch)
    data_batch.numpy()[:] = -1
    labels_batch.numpy()[:] = -2
    with pytest.raises(ShapeError, match="not a whole number of shards"):
        ds.get_batch(data_batch, labels_batch, 0)
    assert (data_batch.numpy() == -1).all() and (labels_batch.numpy() == -2).all()
    np.testing.assert_array_equal(ds.data.numpy(), data_before)
    np.testing.assert_array_equal(ds.labels.numpy(), labels_before)


@pytest.mark.parametrize("shuffle", [False, True], ids=["no_shuffle", "shuffle"])
@pytest.mark.parametrize("ndata_shard, ndata_batch", SHARD_BATCH)
def test_dataset(shuffle, ndata_shard, ndata_batch):
    # ggml test_dataset: every datapoint comes back intact, in order unless shuffled, and
    # each appears once whenever the batches cover the whole dataset.
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    ds = make_supervised(ndata_shard)
    if shuffle:
        ds.shuffle(cd.opt_ctx, -1)
    data_batch, labels_batch = _batch_tensors(ndata_batch)
    found_ids = []
    for ibatch in range(NDATA // ndata_batch):
        ds.get_batch(data_batch, labels_batch, ibatch)
        data, labels = data_batch.numpy(), labels_batch.numpy()
        for j in range(ndata_batch):
            found = int(data[2 * j] // 16)
            assert data[2 * j] == 16 * found and data[2 * j + 1] == 16 * found + 1
            assert labels[j] == 256 * found
            if not shuffle:
                assert found == ibatch * ndata_batch + j
            found_ids.append(found)
    if not shuffle or NDATA % ndata_batch == 0:
        n = (NDATA // ndata_batch) * ndata_batch
        assert sorted(found_ids) == list(range(n))


@pytest.mark.parametrize("ndata_shard, ndata_batch", [(1, 1), (2, 4), (3, 6), (1, 5)])
def test_get_batch_host_matches_get_batch(ndata_shard, ndata_batch):
    cd = make_ctx_data(opt.OptimizerType.SGD)
    ds = make_supervised(ndata_shard)
    ds.shuffle(cd.opt_ctx)
    data_batch, labels_batch = _batch_tensors(ndata_batch)
    data_arr = np.full((ndata_batch, 2), -1, dtype=np.float32)
    labels_arr = np.full(ndata_batch, -1, dtype=np.float32)
    for ibatch in range(NDATA // ndata_batch):
        ds.get_batch(data_batch, labels_batch, ibatch)
        ds.get_batch_host(data_arr, labels_arr, ibatch)
        np.testing.assert_array_equal(data_arr.reshape(-1), data_batch.numpy())
        np.testing.assert_array_equal(labels_arr, labels_batch.numpy())


def test_shuffle_uses_the_contexts_mt19937_stream():
    # A fresh context shuffles 6 shards to [2,3,0,5,4,1], and again to [0,5,2,3,4,1].
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    ds = make_supervised(1)
    ds.shuffle(cd.opt_ctx)
    assert ds.permutation.tolist() == [2, 3, 0, 5, 4, 1]
    data_batch, labels_batch = _batch_tensors(6)
    ds.get_batch(data_batch, labels_batch, 0)
    assert (data_batch.numpy()[::2] // 16).tolist() == [2, 3, 0, 5, 4, 1]
    assert labels_batch.numpy().tolist() == [512, 768, 0, 1280, 1024, 256]
    ds.shuffle(cd.opt_ctx)
    assert ds.permutation.tolist() == [0, 5, 2, 3, 4, 1]


def test_shuffle_prefix_keeps_tail():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    ds = make_supervised(1)
    ds.shuffle(cd.opt_ctx, 4)
    perm = ds.permutation
    assert sorted(perm[:4].tolist()) == [0, 1, 2, 3]
    assert perm[4:].tolist() == [4, 5]
    ds.shuffle(cd.opt_ctx, 0)
    assert ds.permutation.tolist() == perm.tolist()


def test_rng_seed_option():
    seeded = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False)
    seeded.params.rng_seed = 12345
    default = make_ctx_data(opt.OptimizerType.ADAMW)
    a, b = make_supervised(1), make_supervised(1)
    a.shuffle(opt.OptContext(seeded.params))
    b.shuffle(default.opt_ctx)
    assert sorted(a.permutation.tolist()) == list(range(6))
    assert a.permutation.tolist() != b.permutation.tolist()


def test_typed_dataset_i32_tokens_and_tail():
    # 7 datapoints in shards of 2: the last datapoint belongs to no shard and is never served.
    ds = opt.Dataset(ggopt.I32, ggopt.I64, 3, 1, 7, 2)
    assert ds.ndata == 7 and ds.nshards == 3 and ds.ndata_shard == 2
    assert ds.data.type is ggopt.I32 and ds.data.ne[:2] == (3, 7)
    assert ds.labels.type is ggopt.I64 and ds.labels.ne[:2] == (1, 7)
    ds.data.numpy()[:] = np.arange(21, dtype=np.int32).reshape(7, 3)
    ds.labels.numpy()[:] = np.arange(7, dtype=np.int64)[:, None] * 10
    data = np.zeros((4, 3), dtype=np.int32)
    labels = np.zeros(4, dtype=np.int64)
    ds.get_batch_host(data, labels, 0)
    np.testing.assert_array_equal(data, np.arange(12).reshape(4, 3))
    np.testing.assert_array_equal(labels, [0, 10, 20, 30])
    with pytest.raises(ggopt.ShapeError, match="out of range"):
        ds.get_batch_host(data, labels, 1)


def test_unsupervised_dataset_has_no_labels():
    ds = opt.Dataset(ggopt.F16, ggopt.F32, 4, 0, 10, 5)
    assert ds.labels is None
    assert ds.data.type is ggopt.F16
    ds.data.numpy()[:] = np.arange(40, dtype=np.float16).reshape(10, 4)
    out = np.zeros((5, 4), dtype=np.float16)
    ds.get_batch_host(out, None, 1)
    np.testing.assert_array_equal(out.reshape(-1), np.arange(20, 40, dtype=np.float16))


class _DeviceLikeBackend(gb.CPUBackend):
    """A CPU backend that claims its memory is not host RAM, like a GPU backend."""

    name = "device-like"
    is_host = False

    def _copy_out(self, t):
        return np.array(t.array4d(), copy=True).reshape(t.shape)


def test_get_batch_into_device_tensors_goes_through_tensor_set():
    cd = make_ctx_data(opt.OptimizerType.ADAMW)
    ds = make_supervised(2)
    ds.shuffle(cd.opt_ctx)
    ctx = ggopt.Context()
    data_batch = ctx.new_tensor_1d(ggopt.F32, 8)
    labels_batch = ctx.new_tensor_1d(ggopt.F32, 4)
    gb.alloc_ctx_tensors(ctx, _DeviceLikeBackend())
    assert not data_batch.is_host
    host_data = np.zeros(8, np.float32)
    host_labels = np.zeros(4, np.float32)
    ds.get_batch(data_batch, labels_batch, 0)
    ds.get_batch_host(host_data, host_labels, 0)
    np.testing.assert_array_equal(gb.tensor_get(data_batch), host_data)
    np.testing.assert_array_equal(gb.tensor_get(labels_batch), host_labels)
    first = int(host_data[0] // 16)
    assert host_labels[0] == 256 * first
