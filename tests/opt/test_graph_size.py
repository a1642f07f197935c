"""``OptParams.graph_size`` (not in ggml): the node capacity of the static forward graph that
``ggml_opt_init`` builds, ggml's 2048 by default; a model with more nodes needs a larger one."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import opt
from ggopt.errors import DTypeError, InvalidValueError, ShapeError


def _chain_params(n_adds: int) -> tuple[opt.OptParams, ggopt.Tensor, ggopt.Tensor]:
    """A static-graph model of ``n_adds`` chained adds of a trained bias (n_adds + 1 nodes)."""
    backend = gb.cpu_init()
    ctx_static = ggopt.Context()
    inputs = ggopt.set_name(ctx_static.new_tensor_2d(ggopt.F32, 3, 2), "inputs")
    bias = ggopt.set_name(ctx_static.new_tensor_1d(ggopt.F32, 3), "bias")
    ggopt.set_param(bias)
    gb.alloc_ctx_tensors(ctx_static, backend)
    bias.numpy()[:] = [0.1, -0.2, 0.3]
    ctx_compute = ggopt.Context()
    out = inputs
    for _ in range(n_adds):
        out = ggopt.add(ctx_compute, out, bias)
    params = opt.default_params(gb.Scheduler([backend]), opt.LossType.SUM)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, out
    params.optimizer = opt.OptimizerType.SGD
    return params, inputs, bias


def test_default_is_ggml_graph_size():
    params, _, _ = _chain_params(1)
    assert params.graph_size == ggopt.GRAPH_DEFAULT_SIZE == 2048


def test_a_static_graph_over_the_default_needs_a_larger_graph_size():
    params, inputs, bias = _chain_params(2100)
    with pytest.raises(ShapeError, match="need more than OptParams.graph_size=2048 nodes"):
        opt.OptContext(params)
    params.graph_size = 16384
    ctx = opt.OptContext(params)
    ctx.alloc(True)
    gb.tensor_set(inputs, np.ones((2, 3), np.float32))
    ctx.eval(opt.Result())
    # SUM loss of 2 rows x (1 + 2100 b): d/db = 2 * 2100 per element, SGD lr 1e-3 (ggml's)
    np.testing.assert_allclose(bias.numpy(), np.array([0.1, -0.2, 0.3]) - 1e-3 * 4200,
                               rtol=1e-5)
    ctx.close()


@pytest.mark.parametrize("bad, err", [(0, InvalidValueError), (-5, InvalidValueError),
                                      (2.5, DTypeError), (True, DTypeError), ("2048", DTypeError)])
def test_bad_graph_size_is_refused(bad, err):
    params, _, _ = _chain_params(1)
    params.graph_size = bad
    with pytest.raises(err, match="graph_size"):
        opt.OptContext(params)
