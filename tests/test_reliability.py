"""Regression tests for issue 9: misuse found by adversarial testing raises a GgoptError before
anything changes (or works), never a crash, a foreign exception or a silent wrong result."""

from __future__ import annotations

import math
import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from _opt_fixture import get_test_opt_pars, make_ctx_data

import ggopt
from ggopt import (
    DTypeError,
    GgoptError,
    InvalidValueError,
    OutOfMemoryError,
    ShapeError,
    StateError,
    opt,
)
from ggopt import backend as gb
from ggopt.io import gguf as ggio
from ggopt.io import idx

# --- 1. absurd thread counts ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1000, 100_000, 2**31])
def test_absurd_thread_counts_are_refused(n):
    before = ggopt.get_n_threads()
    with pytest.raises(InvalidValueError, match="at most"):
        ggopt.set_n_threads(n)
    assert ggopt.get_n_threads() == before
    with pytest.raises(InvalidValueError, match="at most"):
        gb.cpu_init(n)
    with pytest.raises(InvalidValueError, match="at most"):
        gb.cpu_init().set_n_threads(n)


def test_thread_count_limit_is_at_least_the_cpu_count():
    # MAX_N_THREADS itself is used in a child process (tests/test_no_crash_subprocess.py): here
    # it would leave that many BLAS and OpenMP threads parked in the test process
    from ggopt.backend.cpu.threads import MAX_N_THREADS

    assert MAX_N_THREADS >= max(512, os.cpu_count() or 1)
    with pytest.raises(InvalidValueError, match=f"at most {MAX_N_THREADS}"):
        ggopt.set_n_threads(MAX_N_THREADS + 1)


# --- 2. views never escape their tensor ----------------------------------------------------


def _two_tensors():
    ctx = ggopt.Context()
    a = ctx.new_tensor_1d(ggopt.F32, 16)
    b = ctx.new_tensor_1d(ggopt.F32, 16)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init())
    return ctx, a, b


@pytest.mark.parametrize("make", [
    lambda ctx, b: ggopt.view_2d(ctx, b, 4, 4, -64, 0),
    lambda ctx, b: ggopt.view_2d(ctx, b, 4, 2, -16, 32),
    lambda ctx, b: ggopt.view_3d(ctx, b, 2, 2, 2, 8, -16, 32),
    lambda ctx, b: ggopt.view_4d(ctx, b, 2, 1, 1, 2, 8, 8, -8, 32),
])
def test_negative_view_strides_are_refused(make):
    ctx, a, b = _two_tensors()
    n = len(ctx)
    with pytest.raises(ShapeError, match="stride"):
        make(ctx, b)
    assert len(ctx) == n


def test_acc_with_negative_stride_is_refused():
    ctx, a, b = _two_tensors()
    small = ctx.new_tensor_2d(ggopt.F32, 2, 2)
    with pytest.raises(ShapeError, match="stride"):
        ggopt.acc(ctx, a, small, -64, 0, 0, 32)
    with pytest.raises(ShapeError, match="stride"):
        ggopt.acc(ctx, a, ctx.new_tensor_3d(ggopt.F32, 2, 1, 2), 8, -8, 0, 32)


def test_inplace_op_through_a_view_stays_inside_its_tensor():
    ctx, a, b = _two_tensors()
    a.numpy()[:] = 7.0
    b.numpy()[:] = 1.0
    v = ggopt.view_2d(ctx, b, 4, 4, 16, 0)  # the whole of b, in bounds
    out = ggopt.scale_inplace(ctx, v, 3.0)
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    gb.Scheduler([gb.cpu_init()]).graph_compute(g)
    assert np.all(b.numpy() == 3.0) and np.all(a.numpy() == 7.0)


# --- 3. file writers never damage an existing file -----------------------------------------


def _leftovers(d: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


@pytest.mark.parametrize("metadata", [{"k": "\ud800"}, {"\udcff": 1}, {"k": ["a", "\ud800"]}])
def test_gguf_save_refuses_unencodable_text_and_keeps_the_file(tmp_path, metadata):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    before = path.read_bytes()
    with pytest.raises(ShapeError, match="UTF-8"):
        ggio.save(path, {"w": np.zeros(3, np.float32)},
                  {"general.architecture": "x", **metadata})
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"m.gguf"}) == []


def test_gguf_save_refuses_unencodable_names(tmp_path):
    path = tmp_path / "m.gguf"
    with pytest.raises(ShapeError):
        ggio.save(path, {"\ud800": np.ones(3, np.float32)}, {"general.architecture": "x"})
    with pytest.raises(ShapeError, match="UTF-8"):
        ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "\ud800"})
    assert not path.exists()


def test_gguf_save_failing_mid_write_keeps_the_file(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    before = path.read_bytes()

    def boom(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ggio.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(OSError, match="disk full"):
        ggio.save(path, {"w": np.zeros(5, np.float32)}, {"general.architecture": "y"})
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"m.gguf"}) == []


@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_idx_write_failing_mid_write_keeps_the_file(tmp_path, monkeypatch, name):
    path = tmp_path / name
    idx.write(path, np.arange(6, dtype=np.uint8).reshape(2, 3))
    before = path.read_bytes()

    def failing(out, header, payload):
        out.write(header)
        raise OSError("disk full")

    monkeypatch.setattr(idx, "_write_stream", failing)
    with pytest.raises(OSError, match="disk full"):
        idx.write(path, np.zeros((4, 4), dtype=np.uint8))
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {name}) == []


def test_plot_failing_mid_write_keeps_the_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from ggopt.examples.mnist_plot import plot_history

    history = opt.FitHistory()
    for name in ("train", "val"):
        for field in ("loss", "loss_unc", "acc", "acc_unc"):
            getattr(history, f"{name}_{field}").append(0.5)
    history.seconds.append(1.0)
    path = tmp_path / "curves.png"
    plot_history(history, path)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")
    real_savefig = Figure.savefig

    def failing(self, fname, **kwargs):
        real_savefig(self, fname, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", failing)
    with pytest.raises(OSError, match="disk full"):
        plot_history(history, path, title="second")
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"curves.png"}) == []


def test_writers_keep_permissions_like_a_plain_open(tmp_path):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(path, 0o640)
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    assert path.stat().st_mode & 0o777 == 0o640


# --- 4. a failed dynamic alloc leaves the user's graph alone ---------------------------------


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


# --- 5. graph_compute never computes another graph -------------------------------------------


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


# --- 6. GGUF nested metadata arrays ---------------------------------------------------------

_STRING, _ARRAY, _UINT8 = 8, 9, 0


def _gstr(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _gguf_with_kv(key: bytes, vtype: int, payload: bytes) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    arch = _gstr(b"general.architecture") + struct.pack("<I", _STRING) + _gstr(b"x")
    return head + arch + _gstr(key) + struct.pack("<I", vtype) + payload


def test_gguf_nested_array_with_an_empty_first_item_is_refused(tmp_path):
    # [[], ["zz"]]: an array of 2 arrays, the first empty (of uint8), the second one string
    inner_empty = struct.pack("<IQ", _UINT8, 0)
    inner_str = struct.pack("<IQ", _STRING, 1) + _gstr(b"zz")
    payload = struct.pack("<IQ", _ARRAY, 2) + inner_empty + inner_str
    path = tmp_path / "nested.gguf"
    path.write_bytes(_gguf_with_kv(b"k", _ARRAY, payload))
    with pytest.raises(DTypeError, match="nested"):
        ggio.load(path)


def test_gguf_deeply_nested_arrays_are_refused(tmp_path):
    depth = 3000
    payload = struct.pack("<IQ", _ARRAY, 1) * depth + struct.pack("<IQ", _UINT8, 0)
    path = tmp_path / "deep.gguf"
    path.write_bytes(_gguf_with_kv(b"k", _ARRAY, payload))
    with pytest.raises(DTypeError, match="nested"):
        ggio.load(path)


# --- 7. an interrupted epoch leaves the context usable -------------------------------------


class _Interrupting:
    """get_opt_pars that raises KeyboardInterrupt on its first call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ud):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt
        return get_test_opt_pars(ud)


def test_interrupted_epoch_leaves_the_context_usable():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    cd.params.get_opt_pars = _Interrupting()
    ctx = opt.OptContext(cd.params)
    with pytest.raises(KeyboardInterrupt):
        opt.epoch(ctx, cd.dataset_unsupervised, None, None, -1)
    assert cd.w == 3.0  # no step was taken
    result = opt.Result()
    opt.epoch(ctx, cd.dataset_unsupervised, result, None, -1)
    assert result.ndata == 6 and cd.w == 3.0 - 6.0


def test_reset_then_alloc_after_an_interrupted_eval():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = _Interrupting()
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    with pytest.raises(KeyboardInterrupt):
        ctx.eval()
    ctx.reset(True)
    ctx.alloc(True)
    ctx.eval()
    assert cd.w == 2.0


# --- 8. foreign exceptions become GgoptErrors -----------------------------------------------


def _idx_bytes(dims: list[int], payload: bytes = b"") -> bytes:
    return bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


@pytest.mark.parametrize("dims, payload", [
    ([1] * 65, b"\x07"),
    ([1] * 255, b"\x07"),
    ([0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b""),
])
def test_idx_headers_numpy_cannot_represent(tmp_path, dims, payload):
    path = tmp_path / "x.idx"
    path.write_bytes(_idx_bytes(dims, payload))
    with pytest.raises(ShapeError, match="dimension"):
        idx.read(path)


def test_idx_64_dims_and_empty_shapes_still_load(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(_idx_bytes([1] * 64, b"\x07"))
    assert idx.read(path).shape == (1,) * 64
    path.write_bytes(_idx_bytes([0, 5]))
    assert idx.read(path).shape == (0, 5)


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


def _compute(out, ctx):
    g = ggopt.new_graph(ctx)
    ggopt.build_forward_expand(g, out)
    sched = gb.Scheduler([gb.cpu_init()])
    sched.graph_compute(g)
    return out


def _host_ctx():
    return ggopt.Context(no_alloc=False)


def test_im2col_with_huge_stride_and_padding_needs_little_memory():
    ctx = _host_ctx()
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1)
    x = ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1)
    x.numpy()[:] = np.arange(64, dtype=np.float32).reshape(x.shape)
    s, p = 2**31 - 1, 2**30
    cols = ggopt.im2col(ctx, k, x, s, s, p, p, 1, 1)
    assert cols.ne == (9, 2, 2, 1)
    _compute(cols, ctx)
    # reference: every window lies in the zero padding except where it covers the image
    got = cols.numpy()
    want = np.zeros_like(got)
    img = x.numpy().reshape(8, 8)
    for oh in range(2):
        for ow in range(2):
            for kh in range(3):
                for kw in range(3):
                    iy, ix = oh * s + kh - p, ow * s + kw - p
                    if 0 <= iy < 8 and 0 <= ix < 8:
                        want[oh, ow, kh * 3 + kw] = img[iy, ix]
    assert np.array_equal(got, want)


def test_im2col_back_with_huge_stride_and_padding_needs_little_memory():
    ctx = _host_ctx()
    k = ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1)
    g = ctx.new_tensor_4d(ggopt.F32, 9, 2, 2, 1)
    g.numpy()[:] = 1.0
    s, p = 2**31 - 1, 2**30
    out = ggopt.im2col_back(ctx, g, k, (8, 8, 1, 1), s, s, p, p, 1, 1)
    _compute(out, ctx)
    assert np.all(out.numpy() == 0.0)  # every window reads the padding only


@pytest.mark.parametrize("build", [
    lambda ctx: ggopt.im2col(ctx, ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1),
                             ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), 2**31, 1, 0, 0, 1, 1),
    lambda ctx: ggopt.im2col(ctx, ctx.new_tensor_4d(ggopt.F32, 3, 3, 1, 1),
                             ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), 1, 1, 2**31, 0, 1, 1),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_MAX,
                              2, 2, 2**31, 2, 0, 0),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_AVG,
                              0, 2, 1, 1, 0, 0),
    lambda ctx: ggopt.pool_2d(ctx, ctx.new_tensor_4d(ggopt.F32, 8, 8, 1, 1), ggopt.OP_POOL_AVG,
                              2, -1, 1, 1, 0, 0),
    lambda ctx: ggopt.cross_entropy_loss(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3),
                                         ctx.new_tensor_2d(ggopt.F32, 0, 3)),
])
def test_ops_refuse_values_the_kernels_cannot_take(build):
    ctx = ggopt.Context()
    with pytest.raises(ShapeError):
        build(ctx)


@pytest.mark.parametrize("build", [
    lambda ctx: ggopt.scale(ctx, ctx.new_tensor_1d(ggopt.F32, 3), 10**400),
    lambda ctx: ggopt.soft_max_ext(ctx, ctx.new_tensor_1d(ggopt.F32, 3), None, -(10**400), 0.0),
])
def test_ops_refuse_scalars_beyond_float(build):
    ctx = ggopt.Context()
    with pytest.raises(InvalidValueError, match="must fit in a float"):
        build(ctx)


@pytest.mark.parametrize("build, ne", [
    (lambda ctx: ggopt.mul_mat(ctx, ctx.new_tensor_2d(ggopt.F32, 3, 2),
                               ctx.new_tensor_3d(ggopt.F32, 3, 4, 0)), (2, 4, 0, 1)),
    (lambda ctx: ggopt.add(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3),
                           ctx.new_tensor_2d(ggopt.F32, 0, 3)), (0, 3, 1, 1)),
    (lambda ctx: ggopt.mul_mat(ctx, ctx.new_tensor_2d(ggopt.F32, 3, 2),
                               ctx.new_tensor_2d(ggopt.F32, 3, 0)), (2, 0, 1, 1)),
    (lambda ctx: ggopt.sum(ctx, ctx.new_tensor_2d(ggopt.F32, 0, 3)), (1, 1, 1, 1)),
])
def test_empty_operands_compute(build, ne):
    ctx = _host_ctx()
    out = build(ctx)
    assert out.ne == ne
    _compute(out, ctx)
    assert np.all(out.numpy() == 0.0)


def test_fit_refuses_an_overflowing_val_split():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    with pytest.raises(InvalidValueError, match="val_split"):
        opt.fit(cd.sched, cd.ctx_compute, cd.inputs, cd.outputs, cd.dataset_unsupervised,
                opt.LossType.SUM, opt.OptimizerType.SGD, get_test_opt_pars, 1, 1, 10**400, True)
    assert cd.w == 3.0


@pytest.mark.parametrize("value", [[0.1], (0.1, 0.2), "0.1", None, 10**400])
def test_optimizer_values_of_the_wrong_kind_are_refused_before_a_step(value):
    pars = get_test_opt_pars()
    pars.sgd.alpha = value
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = lambda ud: pars
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    with pytest.raises(GgoptError, match="alpha"):
        ctx.eval()
    assert cd.w == 3.0
    pars.sgd.alpha = 1.0
    ctx.eval()
    assert cd.w == 2.0


# --- 9. threads ------------------------------------------------------------------------------


def _shared_scheduler_model():
    ctx_static = ggopt.Context()
    x = ctx_static.new_tensor_1d(ggopt.F32, 4096)
    gb.alloc_ctx_tensors(ctx_static, gb.cpu_init())
    x.numpy()[:] = 1.0
    graphs = []
    for s in (2.0, 3.0):
        ctx = ggopt.Context()
        h = ggopt.scale(ctx, x, s)
        for _ in range(6):
            h = ggopt.relu(ctx, ggopt.add(ctx, h, x))
        out = ggopt.sum(ctx, h)
        g = ggopt.new_graph(ctx)
        ggopt.build_forward_expand(g, out)
        graphs.append((g, out, 4096.0 * (s + 6)))
    return graphs


def _run_threads(fn, n=2):
    errors: list[BaseException] = []

    def body(i):
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_scheduler_from_two_threads_serialised_by_its_lock():
    graphs = _shared_scheduler_model()
    sched = gb.Scheduler([gb.cpu_init()])
    wrong = []

    def work(i):
        g, out, want = graphs[i]
        for _ in range(60):
            with sched:
                sched.reset()
                sched.alloc_graph(g)
                sched.graph_compute(g)
                got = float(gb.tensor_get(out)[0])
            if got != want:
                wrong.append((i, got))

    assert _run_threads(work) == []
    assert wrong == []


def test_scheduler_from_two_threads_without_the_lock_never_computes_silently_wrong():
    graphs = _shared_scheduler_model()
    sched = gb.Scheduler([gb.cpu_init()])
    wrong, refused = [], []

    def work(i):
        g, out, want = graphs[i]
        for _ in range(60):
            try:
                sched.reset()
                sched.alloc_graph(g)
                sched.graph_compute(g)
                got = float(gb.tensor_get(out)[0])
            except StateError:
                refused.append(i)
                continue
            if got != want:
                wrong.append((i, got))

    assert _run_threads(work) == []
    assert wrong == []


def _two_contexts_on_one_scheduler(sched):
    out = []
    for _ in range(2):
        cd = make_ctx_data(opt.OptimizerType.ADAMW, init_opt_ctx=False, batch_axis=True,
                           nbatch_physical=2, nbatch_logical=2)
        cd.params.backend_sched = sched
        cd.params.get_opt_pars = get_test_opt_pars
        out.append((cd, opt.OptContext(cd.params)))
    return out


def test_two_opt_contexts_sharing_a_scheduler_train_in_two_threads():
    sched = gb.Scheduler([gb.cpu_init()])
    pairs = _two_contexts_on_one_scheduler(sched)
    results = [opt.Result(), opt.Result()]

    def work(i):
        cd, ctx = pairs[i]
        for _ in range(25):
            opt.epoch(ctx, cd.dataset_unsupervised, results[i], None, -1)

    assert _run_threads(work) == []
    # the same training alone, for reference
    ref_cd, ref_ctx = _two_contexts_on_one_scheduler(gb.Scheduler([gb.cpu_init()]))[0]
    ref = opt.Result()
    for _ in range(25):
        opt.epoch(ref_ctx, ref_cd.dataset_unsupervised, ref, None, -1)
    for cd, _ in pairs:
        assert cd.w == ref_cd.w
    for r in results:
        assert r.loss() == ref.loss() and r.ndata == ref.ndata


def test_one_opt_context_from_two_threads():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False, batch_axis=True)
    cd.params.get_opt_pars = get_test_opt_pars
    ctx = opt.OptContext(cd.params)
    # epoch holds the context for its whole run: two threads' epochs are serialised
    assert _run_threads(lambda i: opt.epoch(ctx, cd.dataset_unsupervised, None, None, -1)) == []
    assert cd.w == 3.0 - 12.0
    # an alloc/eval pair belongs to the thread that allocated
    ctx.alloc(True)
    errors = _run_threads(lambda i: ctx.eval(), n=1)
    assert len(errors) == 1 and isinstance(errors[0], StateError)
    assert "thread" in str(errors[0])
    ctx.eval()
    assert cd.w == 3.0 - 13.0
    assert not math.isnan(cd.w)



def test_reset_keeps_an_alloc_whose_eval_was_not_tried():
    cd = make_ctx_data(opt.OptimizerType.SGD, init_opt_ctx=False)
    cd.params.get_opt_pars = get_test_opt_pars
    ctx = opt.OptContext(cd.params)
    ctx.alloc(True)
    ctx.reset(False)  # as in ggml: the alloc stands
    ctx.eval()
    assert cd.w == 2.0
