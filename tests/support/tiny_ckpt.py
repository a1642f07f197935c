"""A tiny static optimization (one 3x4 weight, cross-entropy, opt_period 2, a dataset and a
schedule) and its checkpoints, for the checkpoint-integrity tests and the fuzzer: small files
that load in milliseconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import ggopt
from ggopt import opt
from ggopt.backend import alloc_ctx_tensors, tensor_set
from ggopt.io import gguf
from ggopt.models.mnist import model as mnist_model
from ggopt.opt import checkpoint_file
from tests.support.state import observable_state

NDATA, NIN, NOUT, NBATCH = 8, 4, 3, 2


def dataset() -> opt.Dataset:
    ds = opt.Dataset(ggopt.F32, ggopt.F32, NIN, NOUT, NDATA, 1)
    rng = np.random.default_rng(0)
    tensor_set(ds.data, rng.standard_normal((NDATA, NIN)).astype(np.float32))
    tensor_set(ds.labels, np.eye(NOUT, dtype=np.float32)[np.arange(NDATA) % NOUT])
    return ds


def context(sched=None, *, static: bool = True, name: str = "w"):
    """``(ctx, x, logits, weight)``: static graphs by default, dynamic with ``static=False``."""
    backend_sched = mnist_model.make_scheduler()
    params = opt.default_params(backend_sched, opt.LossType.CROSS_ENTROPY)
    params.opt_period = 2
    if sched is not None:
        params.get_opt_pars = sched
    ctx_static = ggopt.Context()
    w = ggopt.set_name(ctx_static.new_tensor_2d(ggopt.F32, NIN, NOUT), name)
    ggopt.set_param(w)
    x = ctx_static.new_tensor_2d(ggopt.F32, NIN, NBATCH)
    alloc_ctx_tensors(ctx_static, backend_sched.backends[0])
    tensor_set(w, np.linspace(-1, 1, NIN * NOUT, dtype=np.float32))
    logits = None
    if static:
        params.ctx_compute = ggopt.Context()
        logits = ggopt.mul_mat(params.ctx_compute, w, x)
        params.inputs, params.outputs = x, logits
    return opt.OptContext(params), x, logits, w, ctx_static


def prepare(ctx: opt.OptContext, x, w) -> None:
    """Dynamic graphs: a fresh forward graph for the next alloc."""
    cc = ggopt.Context()
    logits = ggopt.mul_mat(cc, w, x)
    gf = ggopt.new_graph_custom(cc, ggopt.GRAPH_DEFAULT_SIZE, True)
    ggopt.build_forward_expand(gf, logits)
    ctx.prepare_alloc(cc, gf, x, logits)


def steps(ctx: opt.OptContext, x, w, ds: opt.Dataset, batches) -> None:
    for ibatch in batches:
        if not ctx.static_graphs:
            prepare(ctx, x, w)
            ctx.alloc(True)
            ds.get_batch(x, ctx.labels, ibatch)
        else:
            ds.get_batch(x, ctx.labels, ibatch)
            ctx.alloc(True)
        ctx.eval(None)


def schedule() -> opt.Schedule:
    return opt.warmup_cosine(1e-2, 12, warmup=1)


def save(path: Path, batches, shuffle: bool = True) -> Path:
    """A checkpoint after training on ``batches`` (with the dataset and the schedule)."""
    sched, ds = schedule(), dataset()
    ctx, x, _, w, _keep = context(sched)
    with ctx:
        if shuffle:
            ds.shuffle(ctx, -1)
        steps(ctx, x, w, ds, batches)
        ctx.save_state(path, ds, epoch=1)
    return path


def rewrite(src: Path, dst: Path, meta=None, tensors=None) -> Path:
    """``src`` changed and written with fresh checksums (so the checks behind them run)."""
    metadata, arrays = gguf.load(src)
    metadata = {k: v for k, v in metadata.items() if not k.startswith("ggopt.checksum")}
    metadata.update(meta or {})
    arrays.update(tensors or {})
    checkpoint_file.write_file(dst, metadata, arrays)
    return dst


def state(ctx, ds=None, sched=None) -> tuple:
    return observable_state(ctx, ds, sched)
