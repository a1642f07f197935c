"""The scheduler's refusals: a graph allocated twice, one not allocated or changed since its
allocation, failed allocations that leave the graph unchanged, sizes beyond memory, bad
arguments; and empty tensors that read back with their shape.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import (
    DTypeError,
    InvalidValueError,
    OutOfMemoryError,
    ShapeError,
    StateError,
    opt,
)
from ggopt import backend as gb
from tests.support.helpers import square_graph
from tests.support.opt_fixture import get_test_opt_pars, make_ctx_data
from tests.support.state import observable_state


def test_alloc_graph_twice_without_reset():
    ctx, cctx, a, y, gf = square_graph(3)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(a, np.array([1, 2, 3], np.float32))
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    before = observable_state(ctx, cctx, gf, sched)
    with pytest.raises(StateError, match="alloc_graph: a graph is already allocated.*reset"):
        sched.alloc_graph(gf)
    assert observable_state(ctx, cctx, gf, sched) == before
    sched.graph_compute(gf)  # the first allocation is intact
    np.testing.assert_array_equal(y.numpy(), [1, 4, 9])
    sched.reset()
    assert y.buffer is None
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), [1, 4, 9])


def test_scheduler_and_backend_arguments():
    with pytest.raises(ShapeError, match="at least one backend"):
        gb.Scheduler([])
    with pytest.raises(DTypeError, match="Backend"):
        gb.Scheduler(["cpu"])
    cpu = gb.cpu_init()
    with pytest.raises(ShapeError, match="listed twice"):
        gb.Scheduler([cpu, cpu])
    with pytest.raises(InvalidValueError, match="n_threads"):
        gb.cpu_init(0)
    with pytest.raises(DTypeError, match="Graph"):
        gb.Scheduler([cpu]).alloc_graph(None)


def _forward(cd, size):
    ctx_compute = ggopt.Context()
    outputs = ggopt.scale(ctx_compute, ggopt.add(ctx_compute, cd.inputs, cd.weights), 1.0)
    gf = ggopt.new_graph_custom(ctx_compute, size, True)
    ggopt.build_forward_expand(gf, outputs)
    return ctx_compute, gf, outputs


def _dynamic(size):
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    params = opt.default_params(cd.sched, opt.LossType.SUM)
    params.optimizer = opt.OptimizerType.SGD
    params.get_opt_pars = get_test_opt_pars
    ctx = opt.OptContext(params)
    return (cd, ctx, *_forward(cd, size))


def _graph_state(gf, ctx_compute, *tensors):
    return (list(gf.nodes), list(gf.leafs), set(gf.visited), gf.version, len(ctx_compute),
            [(t, t.flags, t.name) for t in list(ctx_compute) + list(tensors)])


def test_failed_dynamic_alloc_leaves_the_graph_unchanged():
    # room for the forward graph and its loss, not for the backward pass
    cd, ctx, ctx_compute, gf, outputs = _dynamic(size=4)
    ctx.prepare_alloc(ctx_compute, gf, cd.inputs, outputs)
    before = _graph_state(gf, ctx_compute, cd.inputs, cd.weights)
    with pytest.raises(ShapeError, match="full"):
        ctx.alloc(True)
    assert _graph_state(gf, ctx_compute, cd.inputs, cd.weights) == before
    with pytest.raises(ShapeError, match="full"):  # the same error, not "already has a LOSS"
        ctx.alloc(False)
    assert _graph_state(gf, ctx_compute, cd.inputs, cd.weights) == before
    # a graph that fits works afterwards
    ctx_compute2, gf2, outputs2 = _forward(cd, ggopt.GRAPH_DEFAULT_SIZE)
    ctx.prepare_alloc(ctx_compute2, gf2, cd.inputs, outputs2)
    ctx.alloc(True)
    cd.set_inputs(1.0)
    ctx.eval()
    assert cd.w == 2.0  # one SGD step of alpha=1 on d(sum)/dw = 1


def test_failed_static_init_leaves_the_graph_unchanged():
    # d(view of a transposed parameter) is not supported: the backward build fails
    ctx_static = ggopt.Context()
    inputs = ctx_static.new_tensor_1d(ggopt.F32, 4)
    w = ctx_static.new_tensor_2d(ggopt.F32, 2, 2)
    ggopt.set_param(w)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    ctx_compute = ggopt.Context()
    v = ggopt.view_1d(ctx_compute, ggopt.transpose(ctx_compute, w), 2, 0)
    outputs = ggopt.add(ctx_compute, ggopt.view_1d(ctx_compute, inputs, 2, 0), v)
    params = opt.default_params(gb.Scheduler([gb.cpu_init()]), opt.LossType.SUM)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, outputs
    before = [(t, t.flags, t.name) for t in [*ctx_compute, inputs, w]]
    n = len(ctx_compute)
    with pytest.raises(ShapeError, match="non-contiguous"):
        opt.OptContext(params)
    assert len(ctx_compute) == n
    assert [(t, t.flags, t.name) for t in [*ctx_compute, inputs, w]] == before


def _scaled_graph(ctx, x, s):
    out = ggopt.scale(ctx, x, s)
    ggopt.set_output(out)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    return g, out


def test_graph_compute_refuses_a_graph_that_is_not_allocated():
    ctx_static = ggopt.Context()
    x = ctx_static.new_tensor_1d(ggopt.F32, 4)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    x.numpy()[:] = 1.0
    ctx = ggopt.Context()
    g1, out1 = _scaled_graph(ctx, x, 2.0)
    g2, out2 = _scaled_graph(ctx, x, 3.0)
    sched = gb.Scheduler([gb.cpu_init()])
    sched.alloc_graph(g2)
    sched.graph_compute(g2)
    x.numpy()[:] = 5.0
    with pytest.raises(StateError, match="allocated"):
        sched.graph_compute(g1)
    assert np.all(out2.numpy() == 3.0)  # g2 was not recomputed either
    assert sched.allocated_graph is g2
    sched.reset()
    sched.graph_compute(g1)
    assert np.all(out1.numpy() == 10.0)


def test_graph_compute_refuses_a_graph_changed_since_alloc():
    ctx_static = ggopt.Context()
    x = ctx_static.new_tensor_1d(ggopt.F32, 4)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    ctx = ggopt.Context()
    g, _ = _scaled_graph(ctx, x, 2.0)
    sched = gb.Scheduler([gb.cpu_init()])
    sched.alloc_graph(g)
    ggopt.build_forward_expand(g, ggopt.relu(ctx, x))
    with pytest.raises(StateError, match="changed"):
        sched.graph_compute(g)


@pytest.mark.parametrize("ne, shape", [((4, 0), (0, 4)), ((0,), (0,)),
                                       ((1, 0, 1, 3), (3, 1, 0, 1))])
def test_empty_tensors_read_back_with_their_shape(ne, shape):
    ctx = ggopt.Context()
    t = ctx.new_tensor(ggopt.F32, ne)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    assert t.shape == shape
    assert t.numpy().shape == shape
    assert gb.tensor_get(t).shape == shape


def test_huge_allocations_raise_out_of_memory():
    with pytest.raises(OutOfMemoryError):
        ggopt.Context(no_alloc=False).new_tensor_2d(ggopt.F32, 2**31, 2**31)
    # sizes beyond the 128 TiB address space, so that even an overcommitting kernel refuses
    ctx = ggopt.Context()
    ctx.new_tensor_1d(ggopt.F32, 16)
    ctx.new_tensor_2d(ggopt.F32, 2**24, 2**24)  # 4 PiB
    with pytest.raises(OutOfMemoryError):
        gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    assert all(t.buffer is None for t in ctx)
    with pytest.raises(OutOfMemoryError):
        opt.Dataset(ggopt.F32, ggopt.F32, 2**10, 0, 2**40, 1)
    with pytest.raises(OutOfMemoryError):
        gb.cpu_init().alloc_buffer(2**62)


# --- read-only memory (tensors over a mapped file's bytes) -------------------------------------


def _mapped(ctx: ggopt.Context, qtype: ggopt.GGType, ne: tuple[int, ...], data: np.ndarray,
            name: str) -> ggopt.Tensor:
    from ggopt.quants import tensor_from_blocks

    ro = data.copy()
    ro.flags.writeable = False  # as a np.memmap of a file opened for reading
    return tensor_from_blocks(ctx, qtype, ne, ro, name)


def test_writing_a_read_only_tensor_is_refused_and_changes_nothing():
    from ggopt.quants import quantize

    raw = quantize(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64), ggopt.GGType.Q8_0)
    ctx = ggopt.Context(no_alloc=True)
    w = _mapped(ctx, ggopt.GGType.Q8_0, (64, 2), raw, "wq")
    f = _mapped(ctx, ggopt.F32, (3,), np.arange(3, dtype=np.float32), "wf")
    with pytest.raises(StateError, match="tensor_set: tensor 'wq' lives in read-only memory"):
        gb.tensor_set(w, np.zeros_like(raw))
    with pytest.raises(StateError, match="tensor_memset: tensor 'wf' lives in read-only"):
        gb.tensor_fill(f, 7.0)
    np.testing.assert_array_equal(gb.tensor_get(w), raw)
    np.testing.assert_array_equal(gb.tensor_get(f), [0, 1, 2])


def test_a_graph_writing_read_only_memory_is_refused_at_alloc():
    """cpy into a mapped tensor, or an optimizer step of a mapped parameter: StateError before
    anything runs (was a raw NumPy ValueError in the middle of the compute)."""
    ctx_w = ggopt.Context(no_alloc=True)
    f = _mapped(ctx_w, ggopt.F32, (3,), np.arange(3, dtype=np.float32), "wf")
    ggopt.set_param(f)
    ctx_in, ctx = ggopt.Context(), ggopt.Context()
    x, sgd = ctx_in.new_tensor_1d(ggopt.F32, 3), ctx_in.new_tensor_1d(ggopt.F32, 2)
    gb.alloc_ctx_tensors(ctx_in, gb.cpu_init())
    gb.tensor_set(x, np.ones(3, np.float32))
    y = ggopt.sqr(ctx, x)
    for out in (ggopt.cpy(ctx, y, f), ggopt.opt_step_sgd(ctx, f, y, sgd)):
        g = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(g, out)
        sched = gb.Scheduler([gb.cpu_init()])
        with pytest.raises(StateError, match="would write 'wf', which lives in read-only"):
            sched.alloc_graph(g)
        assert y.buffer is None
    np.testing.assert_array_equal(gb.tensor_get(f), [0, 1, 2])


def test_release_buffers_frees_the_compute_memory_and_the_next_alloc_plans_again():
    import gc
    import weakref

    ctx, cctx = ggopt.Context(), ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, 1000)
    y = ggopt.sqr(cctx, ggopt.scale(cctx, a, 3.0))
    ggopt.set_output(y)
    gf = ggopt.new_graph(cctx)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    gb.tensor_set(a, x)
    sched = gb.Scheduler([cpu])
    sched.graph_compute(gf)
    first = y.numpy().copy()
    held = sched.held_buffer_bytes()
    assert held >= 4000
    buf = weakref.ref(y.buffer)
    sched.release_buffers()
    gc.collect()
    assert buf() is None  # nothing else kept the compute buffer alive
    assert sched.held_buffer_bytes() == 0 and sched.allocated_graph is None
    assert y.buffer is None and a.buffer is not None  # the context's own memory stays
    with pytest.raises(StateError):
        y.numpy()
    sched.graph_compute(gf)  # planned and allocated again
    assert sched.held_buffer_bytes() == held
    np.testing.assert_array_equal(y.numpy(), first)
