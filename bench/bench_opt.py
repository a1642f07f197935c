"""Benchmarks of the opt layer: batch gathering and the per-step overhead of an OptContext.

``Dataset.get_batch`` runs beside ``np.take`` of the same shuffled shards (the same work) and
one ``np.copyto`` of as many contiguous bytes (no gather: the bandwidth bound). Both references
run on one thread, so their targets apply to the ``ggopt_1t`` row (get_batch on one thread);
the ``ggopt`` row runs on the benchmark's threads. The ggopt rows store their ratio to each
reference (``ratio_vs_<ref>``, above 1 is faster) and the issue's target in ``extra_info``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt

pytestmark = pytest.mark.usefixtures("bench_threads")

FAST = {"warmup": True, "warmup_iterations": 1000, "min_rounds": 5}

NE_DATAPOINT, NDATA, NBATCH = 784, 60000, 500  # MNIST images as float32, batch 500


class OneWeight:
    """test-opt's model (ggml-opt-spec §7.1): ``outputs = scale(add(inputs, weights), 1)``,
    SUM loss, AdamW; ``inputs`` and ``weights`` have one element, ``weights`` starts at 3.

    Static graphs are built once by the OptContext; dynamic ones are rebuilt by :meth:`step`
    in a fresh compute context before every ``alloc``.
    """

    def __init__(self, static: bool) -> None:
        cpu = gb.cpu_init()
        self.sched = gb.Scheduler([cpu])
        self.ctx_static = ggopt.Context()
        self.inputs = ggopt.set_name(self.ctx_static.new_tensor_1d(ggopt.F32, 1), "inputs")
        self.weights = ggopt.set_name(self.ctx_static.new_tensor_1d(ggopt.F32, 1), "weights")
        ggopt.set_param(self.weights)
        gb.alloc_ctx_tensors(self.ctx_static, cpu)
        self.weights.numpy()[0] = 3.0
        self.inputs.numpy()[0] = 0.0
        params = opt.default_params(self.sched, opt.LossType.SUM)
        if static:
            params.ctx_compute, _, params.outputs = self._forward()
            params.inputs = self.inputs
        self.static = static
        self.opt_ctx = opt.OptContext(params)
        self.result = opt.Result()

    def _forward(self):
        ctx = ggopt.Context()
        add = ggopt.add(ctx, self.inputs, self.weights)
        outputs = ggopt.set_name(ggopt.scale(ctx, add, 1.0), "outputs")
        gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, True)
        ggopt.build_forward_expand(gf, outputs)
        return ctx, gf, outputs

    def step(self) -> None:
        """One optimizer step: (dynamic: prepare_alloc with a new graph), alloc(True), eval."""
        if not self.static:
            ctx, gf, outputs = self._forward()
            self.opt_ctx.prepare_alloc(ctx, gf, self.inputs, outputs)
        self.opt_ctx.alloc(True)
        self.opt_ctx.eval(self.result)


@pytest.fixture(scope="module", params=[1, 10], ids=lambda k: f"shard{k}")
def dataset(request):
    """60000 MNIST-sized float32 datapoints without labels, shards of 1 or 10, shuffled."""
    ds = opt.Dataset(ggopt.F32, ggopt.F32, NE_DATAPOINT, 0, NDATA, request.param)
    np.random.default_rng(0).random(dtype=np.float32, out=ds.data.numpy())
    ds.shuffle(OneWeight(static=True).opt_ctx)
    return ds


def _batch_shards(ds: opt.Dataset) -> list[np.ndarray]:
    """The shard indices of every batch, in permutation order."""
    return list(ds.permutation.reshape(-1, NBATCH // ds.ndata_shard))


def _batch_rows(ds: opt.Dataset) -> list[np.ndarray]:
    """The datapoint indices of every batch, in permutation order."""
    k = ds.ndata_shard
    return [(s[:, None] * k + np.arange(k)).reshape(-1) for s in _batch_shards(ds)]


@pytest.mark.benchmark(**FAST)
@pytest.mark.parametrize("impl", ["copyto", "take", "ggopt_1t", "ggopt"])
def test_get_batch(benchmark, ratio_to, bench_threads, dataset, impl):
    """One batch of 500 images per call, cycling through the epoch's 120 batches."""
    benchmark.group = f"get_batch [784 floats x 500, shard {dataset.ndata_shard}]"
    data = dataset.data.numpy()
    rows = _batch_rows(dataset)
    ibatch = itertools.cycle(range(len(rows)))
    if impl.startswith("ggopt"):
        ctx = ggopt.Context()
        batch = ctx.new_tensor_2d(ggopt.F32, NE_DATAPOINT, NBATCH)
        gb.alloc_ctx_tensors(ctx, gb.cpu_init())
        out = batch.numpy()
        ggopt.set_n_threads(1 if impl == "ggopt_1t" else bench_threads)  # get_batch follows it
        try:
            benchmark(lambda: dataset.get_batch(batch, None, next(ibatch)))
        finally:
            ggopt.set_n_threads(bench_threads)
    else:
        out = np.empty((NBATCH, NE_DATAPOINT), np.float32)
        if impl == "copyto":  # as many bytes, contiguous and unshuffled: no gather at all
            blocks = [data[i * NBATCH:(i + 1) * NBATCH] for i in range(len(rows))]
            benchmark(lambda: np.copyto(out, blocks[next(ibatch)]))
        else:  # the same gather: whole shards, in the permutation's order
            k = dataset.ndata_shard
            by_shard = data.reshape(-1, k * NE_DATAPOINT)
            out_shards = out.reshape(-1, k * NE_DATAPOINT)
            shards = _batch_shards(dataset)
            benchmark(lambda: np.take(by_shard, shards[next(ibatch)], axis=0, out=out_shards))
    if benchmark.stats is not None:
        benchmark.extra_info["GBps"] = round(out.nbytes / benchmark.stats.stats.median / 1e9, 2)
    if impl != "copyto":  # the batch the row's last call wrote is the permutation's
        i = (next(ibatch) - 1) % len(rows)
        np.testing.assert_array_equal(out, data[rows[i]])
    one = impl == "ggopt_1t"
    ratio_to(impl, copyto=0.7 if one else None, take=1.0 if one else None, ggopt_1t=None)


@pytest.mark.benchmark(group="opt step overhead [1-weight model, AdamW]", **FAST)
@pytest.mark.parametrize("graphs", ["static", "dynamic"])
def test_opt_step_overhead(benchmark, graphs):
    """``alloc(True)`` + ``eval(result)`` per step; the model's kernels are trivial, so this
    is the opt layer's (and the scheduler's) own cost. ``extra_info['us_per_step']``."""
    model = OneWeight(static=graphs == "static")
    benchmark(model.step)
    assert model.result.ndata > 0
    assert np.isfinite(model.weights.numpy()[0])
    if benchmark.stats is not None:
        benchmark.extra_info["us_per_step"] = round(benchmark.stats.stats.median * 1e6, 1)
