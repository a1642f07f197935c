"""Two backends under one scheduler: a NumPy ArrayBackend (never a host backend, so graphs
really split and copy between it and the CPU) gives the CPU-only results.

The op table :data:`OP_CASES` checks every op of the xp backend against the CPU kernels,
with broadcasting and non-contiguous views; tests/backend/test_cupy.py runs it on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.backend.array.backend import ArrayBackend, numpy_backend
from ggopt.backend.array.ops import COMPILERS
from ggopt.errors import DTypeError, InvalidValueError, ShapeError, StateError
from ggopt.tensor import Op, UnaryOp
from tests.support.backend_cases import (
    F32,
    OP_CASES,
    _cnn,
    _cnn_arrays,
    _mlp,
    _mlp_arrays,
    check_op_case,
    compute,
    forward_backward,
    train_adamw,
)
from tests.support.helpers import new_tensor

# --- running a graph on [front, cpu] or on the CPU alone ----------------------------------








# --- data ---------------------------------------------------------------------------------


















































@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.id)
def test_xp_op_matches_cpu(case):
    check_op_case(numpy_backend(), case)


def test_op_table_covers_every_xp_op():
    covered = set()
    for case in OP_CASES:
        ctx = ggopt.Context()
        ts = [new_tensor(ctx, a) for a in case.arrays(np.random.default_rng(0))]
        out = case.build(ctx, *ts)
        covered.add((out if isinstance(out, ggopt.Tensor) else out[0]).op)
    missing = set(COMPILERS) - covered
    assert not missing, f"ops without a case: {sorted(o.name for o in missing)}"


# --- whole graphs on [NumPy backend, CPU] vs the CPU alone --------------------------------












_SUBSETS = {
    "mlp": {Op.MUL_MAT, Op.OUT_PROD, Op.CROSS_ENTROPY_LOSS_BACK, Op.UNARY_BACK},
    "cnn": {Op.CONV_2D, Op.CONV_2D_BACK_KERNEL, Op.MUL_MAT, Op.POOL_2D, Op.POOL_2D_BACK,
            Op.OUT_PROD, Op.REPEAT_BACK},
}


@pytest.mark.parametrize("subset", [True, False], ids=["subset", "all-ops"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_forward_backward_matches_cpu(model, subset):
    fn, make = {"mlp": (_mlp, _mlp_arrays), "cnn": (_cnn, _cnn_arrays)}[model]
    arrays = make(np.random.default_rng(3))
    want, _ = forward_backward(None, fn, arrays)
    front = numpy_backend(_SUBSETS[model] if subset else None)
    got, sched = forward_backward(front, fn, arrays)
    assert sched.get_n_copies() > 0
    if subset:
        assert sched.get_n_splits() > 1
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")




@pytest.mark.parametrize("subset", [True, False], ids=["subset", "all-ops"])
def test_adamw_training_matches_cpu(subset):
    want_params, want_losses, _ = train_adamw(None)
    front = numpy_backend({Op.MUL_MAT, Op.OUT_PROD, Op.OPT_STEP_ADAMW} if subset else None)
    got_params, got_losses, (splits, copies, labels_backend) = train_adamw(front)
    assert labels_backend is front  # ggml-opt's static tensors go to backend 0
    assert copies > 0
    if subset:
        assert splits > 1
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert not np.allclose(want_losses[0], want_losses[-1])  # the steps moved the weights
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_optimizer_step_refuses_moments_on_another_backend():
    # The AdamW step updates m and v in place: running it on the parameters' backend (CPU)
    # while the moments live on backend 0 would update copies, so alloc refuses.
    with pytest.raises(StateError, match="updates .* in place"):
        train_adamw(numpy_backend(), nsteps=1, params_on_cpu=True)


def _sqr_graph(a: ggopt.Tensor, ctx: ggopt.Context) -> tuple[ggopt.Graph, ggopt.Tensor]:
    y = ggopt.sqr(ctx, a)
    ggopt.set_output(y)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, y)
    return g, y


def test_host_memory_of_another_cpu_backend_is_copied_to_the_node():
    """A tensor in host memory that no backend of the scheduler allocated (another CPU
    backend's buffer, e.g. a mapped file) belongs to the scheduler's CPU backend, as ggml picks
    backends by buffer type; a node on backend 0 gets a copy (was a raw KeyError)."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    a = ctx_w.new_tensor_1d(ggopt.F32, 4)
    gb.alloc_ctx_tensors(ctx_w, gb.cpu_init())
    gb.tensor_set(a, np.array([1, -2, 3, 4], F32))
    g, y = _sqr_graph(a, ctx)
    cpu = gb.cpu_init()
    sched = gb.Scheduler([numpy_backend(), cpu])
    sched.alloc_graph(g)
    sched.graph_compute(g)
    assert sched.get_tensor_backend(a) is cpu and sched.get_n_copies() == 1
    np.testing.assert_array_equal(gb.tensor_get(y), [1, 4, 9, 16])


def test_memory_no_backend_of_the_scheduler_can_read_is_refused():
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    a = ctx_w.new_tensor_1d(ggopt.F32, 4)
    gb.alloc_ctx_tensors(ctx_w, numpy_backend())  # device memory of a backend not listed
    g, y = _sqr_graph(a, ctx)
    sched = gb.Scheduler([gb.cpu_init()])
    with pytest.raises(StateError, match="none of the scheduler's backends"):
        sched.alloc_graph(g)
    assert y.buffer is None


# --- the backend itself -------------------------------------------------------------------


@pytest.mark.parametrize("back", [False, True])
def test_array_backend_pooling_with_absurd_padding_is_refused_and_recovers(back):
    """The array backends pool a padded copy of the input: padding far beyond the image is an
    OutOfMemoryError at alloc_graph (not a bare MemoryError), and the scheduler stays usable."""
    ctx_w, ctx = ggopt.Context(), ggopt.Context()
    x = ctx_w.new_tensor_4d(ggopt.F32, 8, 8, 2, 1)
    ggopt.set_param(x)
    sched = gb.Scheduler([numpy_backend(), gb.cpu_init()])
    gb.alloc_ctx_tensors(ctx_w, sched.backends[0])
    gb.tensor_set(x, np.ones(128, F32))
    y = ggopt.pool_2d(ctx, x, ggopt.OP_POOL_MAX, 3, 3, 2**20, 2**20, 2**20, 2**20)
    if back:
        y = ggopt.pool_2d_back(ctx, y, x, ggopt.OP_POOL_MAX, 3, 3, 2**20, 2**20, 2**20, 2**20)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, y)
    with pytest.raises(ggopt.OutOfMemoryError, match="padded copy"):
        sched.alloc_graph(g)
    ok = ggopt.scale(ctx, x, 2.0)
    g2 = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g2, ok)
    sched.reset()
    sched.graph_compute(g2)
    np.testing.assert_array_equal(gb.tensor_get(ok).reshape(-1), np.full(128, 2.0, F32))


def test_numpy_backend_is_not_host_and_transfers():
    be = numpy_backend()
    assert not be.is_host and be.name == "NumPy"
    ctx = ggopt.Context()
    t = ctx.new_tensor_2d(ggopt.F32, 3, 2)
    gb.alloc_ctx_tensors(ctx, be)
    data = np.arange(6, dtype=F32).reshape(2, 3)
    gb.tensor_set(t, data)
    np.testing.assert_array_equal(gb.tensor_get(t), data)
    with pytest.raises(ggopt.StateError, match="tensor_get"):
        t.numpy()
    gb.tensor_fill(t, 2.5)
    np.testing.assert_array_equal(gb.tensor_get(t), np.full((2, 3), 2.5, F32))


def test_supports_op_follows_the_subset():
    ctx = ggopt.Context()
    a = ctx.new_tensor_2d(ggopt.F32, 4, 3)
    s, m = ggopt.sum(ctx, a), ggopt.mul_mat(ctx, a, a)
    only = numpy_backend({Op.MUL_MAT})
    assert only.supports_op(m) and not only.supports_op(s)
    assert only.supports_op(ggopt.transpose(ctx, a))  # views compute nothing
    assert numpy_backend().supports_op(s)


def test_bad_arguments_raise():
    with pytest.raises(DTypeError, match="Op"):
        numpy_backend(["mul_mat"])
    with pytest.raises(DTypeError, match="name"):
        ArrayBackend(np, 3)


def test_out_of_range_rows_raise_shape_error():
    def build(c, a, i):
        return ggopt.get_rows(c, a, i)

    with pytest.raises(ShapeError, match="get_rows"):
        compute(numpy_backend(), build, [np.zeros((4, 3), F32), np.array([0, 4], np.int32)])


def test_unary_back_of_step_raises():
    def build(c, x, g):
        return c.new_op(ggopt.F32, x.ne, Op.UNARY_BACK, (x, g), UnaryOp.STEP)

    with pytest.raises(InvalidValueError, match="STEP"):
        compute(numpy_backend(), build, [np.zeros(3, F32), np.zeros(3, F32)])
