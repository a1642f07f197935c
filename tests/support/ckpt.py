"""MNIST-FC runs on the bundled subset for the checkpoint tests (also imported by the child
processes of the kill tests, so it must not import pytest).

Every run starts from the same seeded weights; ``opt_period`` is 2 (logical batch 1000 in
physical batches of 500) and 5 % is held out, so an epoch has 3 optimizer steps.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

import ggopt
from ggopt import opt
from ggopt.backend import tensor_get
from ggopt.models.mnist import data as mnist_data
from ggopt.models.mnist import model as mnist_model
from tests.support.state import observable_state

NBATCH_LOGICAL = 1000
NBATCH_PHYSICAL = mnist_model.NBATCH_PHYSICAL
VAL_SPLIT = 0.05
STEPS_PER_EPOCH = 3  # int(0.95 * 4000 / 1000) logical batches
TRAIN_BATCHES = STEPS_PER_EPOCH * NBATCH_LOGICAL // NBATCH_PHYSICAL
ADAMW, SGD = opt.OptimizerType.ADAMW, opt.OptimizerType.SGD
CE = opt.LossType.CROSS_ENTROPY


@functools.cache
def _mnist() -> mnist_data.MnistData:
    return mnist_data.load_mnist(None)


def dataset() -> opt.Dataset:
    mn = _mnist()
    return mnist_data.make_dataset(mn.train_images, mn.train_labels, 10, NBATCH_LOGICAL)


def model() -> mnist_model.MnistModel:
    m = mnist_model.build_model("mnist-fc", mnist_model.make_scheduler())
    mnist_model.init_params(m, 0)
    return m


def schedule(kind: str, nepoch: int = 3) -> opt.Schedule | None:
    """A fresh schedule: ``"cosine"`` over ``nepoch`` epochs, ``"decay"``, ``"constant"``."""
    if kind == "cosine":
        return opt.warmup_cosine(2e-3, nepoch * STEPS_PER_EPOCH, warmup=2, lr_min=1e-5)
    if kind == "decay":
        return opt.epoch_decay(0.05, 1.0, lr_min=0.02)
    if kind == "constant":
        return opt.constant(2e-3)
    return None


def fit_run(nepoch: int, optimizer, sched=None, checkpoint=None, resume=False):
    """``fit`` with static graphs; returns the trained model."""
    m = model()
    gp = opt.get_default_optimizer_params if sched is None else sched
    opt.fit(m.sched, m.ctx_compute, m.images, m.logits, dataset(), CE, optimizer, gp,
            nepoch, NBATCH_LOGICAL, VAL_SPLIT, True, checkpoint=checkpoint, resume=resume)
    return m


def _forward_fc(ctx: ggopt.Context, p: dict, images: ggopt.Tensor) -> ggopt.Tensor:
    h = ggopt.relu(ctx, ggopt.add(ctx, ggopt.mul_mat(ctx, p["fc1.weight"], images),
                                  p["fc1.bias"]))
    return ggopt.add(ctx, ggopt.mul_mat(ctx, p["fc2.weight"], h), p["fc2.bias"])


def dynamic_context(m, optimizer, sched=None) -> opt.OptContext:
    params = opt.default_params(m.sched, CE)
    params.opt_period = NBATCH_LOGICAL // NBATCH_PHYSICAL
    params.optimizer = optimizer
    if sched is not None:
        params.get_opt_pars = sched
    return opt.OptContext(params)


def dynamic_step(ctx: opt.OptContext, m, ds: opt.Dataset, ibatch: int) -> None:
    """One training batch with a freshly built graph (the LLM way)."""
    ctx_compute = ggopt.Context()
    logits = _forward_fc(ctx_compute, m.params, m.images)
    gf = ggopt.new_graph_custom(ctx_compute, ggopt.GRAPH_DEFAULT_SIZE, True)
    ggopt.build_forward_expand(gf, logits)
    ctx.prepare_alloc(ctx_compute, gf, m.images, logits)
    ctx.alloc(True)
    ds.get_batch(m.images, ctx.labels, ibatch)
    ctx.eval(None)


def dynamic_run(nepoch: int, optimizer, sched=None, checkpoint=None, resume=False):
    """A hand-written epoch loop with dynamic graphs and epoch checkpoints, like fit's."""
    m, ds = model(), dataset()
    idata_split = TRAIN_BATCHES * NBATCH_PHYSICAL
    with dynamic_context(m, optimizer, sched) as ctx:
        first = 1
        if resume:
            first = ctx.load_state(checkpoint, ds) + 1
        else:
            ds.shuffle(ctx, -1)
        for iepoch in range(first, nepoch + 1):
            if sched is not None:
                sched.epoch = iepoch - 1
            ds.shuffle(ctx, idata_split)
            for ibatch in range(TRAIN_BATCHES):
                dynamic_step(ctx, m, ds, ibatch)
            if checkpoint is not None:
                ctx.save_state(checkpoint, ds, epoch=iepoch)
    return m


def weights_gguf(m, path: Path) -> bytes:
    """The model written as its GGUF file, as bytes."""
    mnist_model.save_gguf(m, path)
    return Path(path).read_bytes()


def full_state(ctx: opt.OptContext, ds: opt.Dataset | None = None, sched=None) -> tuple:
    """Everything observable about the context, dataset and schedule (tests/support/state.py)."""
    return observable_state(ctx, ds, sched)


def param_bytes(params: dict) -> dict[str, bytes]:
    return {name: np.ascontiguousarray(tensor_get(t)).tobytes() for name, t in params.items()}
