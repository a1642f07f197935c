"""The shared fixture of ggml's test-opt (``helper_get_ctx_data``), for the tests in tests/opt/.

Model: ``outputs = scale(add(inputs, weights), 1.0)`` with a single parameter ``weights``
starting at ``ndata/2 = 3``; ``inputs`` has ``nbatch_physical`` elements, so ``outputs.ne[1]
== 1`` and every eval counts as one datapoint.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import ggopt
from ggopt import backend as gb
from ggopt import opt

NE_DATAPOINT = 2
NE_LABEL = 1
NDATA = 6


def get_test_opt_pars(ud=None) -> opt.OptimizerParams:
    """``helper_get_test_opt_pars``: every step moves w by -sign(g) (AdamW) or -g (SGD)."""
    p = opt.get_default_optimizer_params(ud)
    p.adamw.alpha, p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd = 1.0, 0.0, 0.0, 0.0, 0.0
    p.sgd.alpha, p.sgd.wd = 1.0, 0.0
    return p


def make_supervised(ndata_shard: int) -> opt.Dataset:
    """Datapoint i is (16i, 16i+1) with label 256i."""
    ds = opt.Dataset(ggopt.F32, ggopt.F32, NE_DATAPOINT, NE_LABEL, NDATA, ndata_shard)
    i = np.arange(NDATA, dtype=np.float32)
    ds.data.numpy()[:] = np.stack([16 * i, 16 * i + 1], axis=1)
    ds.labels.numpy()[:] = (256 * i)[:, None]
    return ds


def make_unsupervised() -> opt.Dataset:
    """Datapoint i is i, no labels."""
    ds = opt.Dataset(ggopt.F32, ggopt.F32, 1, 0, NDATA, 1)
    ds.data.numpy()[:] = np.arange(NDATA, dtype=np.float32)[:, None]
    return ds


@dataclasses.dataclass
class CtxData:
    sched: gb.Scheduler
    ctx_static: ggopt.Context
    ctx_compute: ggopt.Context
    inputs: ggopt.Tensor
    weights: ggopt.Tensor
    outputs: ggopt.Tensor
    params: opt.OptParams
    opt_ctx: opt.OptContext | None
    result: opt.Result
    result2: opt.Result
    dataset_unsupervised: opt.Dataset

    @property
    def w(self) -> float:
        return float(self.weights.numpy()[0])

    def set_w(self, value: float) -> None:
        self.weights.numpy()[0] = value

    def set_inputs(self, *values: float) -> None:
        gb.tensor_set(self.inputs, np.array(values, dtype=np.float32))

    def grad_acc(self) -> float:
        return float(gb.tensor_get(self.opt_ctx.grad_acc(self.weights)).reshape(-1)[0])


def make_ctx_data(
    optimizer: opt.OptimizerType,
    *,
    init_opt_ctx: bool = True,
    optimizer_defaults: bool = True,
    nbatch_logical: int = 1,
    nbatch_physical: int = 1,
    loss_type: opt.LossType = opt.LossType.SUM,
    build_type: opt.BuildType = opt.BuildType.OPT,
    batch_axis: bool = False,
) -> CtxData:
    """``helper_get_ctx_data`` with static graphs.

    ``batch_axis`` makes ``inputs`` ``[1, nbatch_physical]`` (one-element datapoints along
    ``ne[1]``, as epoch and fit expect) instead of ggml's ``[nbatch_physical]``.
    """
    backend = gb.cpu_init()
    sched = gb.Scheduler([backend])
    ctx_static = ggopt.Context()
    ne = (1, nbatch_physical) if batch_axis else (nbatch_physical,)
    inputs = ggopt.set_name(ctx_static.new_tensor(ggopt.F32, ne), "inputs")
    weights = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 1), "weights")
    ggopt.set_param(weights)
    gb.alloc_ctx_tensors(ctx_static, backend)
    weights.numpy()[0] = NDATA / 2
    inputs.numpy()[:] = 0.0

    ctx_compute = ggopt.Context()
    outputs = ggopt.scale(ctx_compute, ggopt.add(ctx_compute, inputs, weights), 1.0)
    ggopt.set_name(outputs, "outputs")

    params = opt.default_params(sched, loss_type)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, outputs
    params.opt_period = nbatch_logical // nbatch_physical
    params.optimizer = optimizer
    params.build_type = build_type
    if not optimizer_defaults:
        params.get_opt_pars = get_test_opt_pars
    opt_ctx = opt.OptContext(params) if init_opt_ctx else None
    return CtxData(
        sched, ctx_static, ctx_compute, inputs, weights, outputs, params, opt_ctx,
        opt.Result(), opt.Result(), make_unsupervised(),
    )
