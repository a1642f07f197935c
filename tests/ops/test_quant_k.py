"""Graphs with K-quant weights (``tools.kquants.K_TYPES``): mul_mat / get_rows / cpy to F32 on
the CPU backend (1 and 2 threads, identical bits) and the NumPy array backend (the reference:
gguf.quants' dequantize, then F32); finite-difference gradients through x; views that keep whole
256-element super-blocks; and the refusals (a PARAM, quantizing to a K-quant, partial
super-blocks) before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt._kernels import _ggml_order as go
from ggopt.backend.array.backend import numpy_backend
from ggopt.backend.array.ops.quant import int_product
from ggopt.errors import DTypeError, ShapeError
from ggopt.quants import tensor_from_blocks
from ggopt.types import F32, GGType
from tests.support.helpers import run
from tools.kquants import K_TYPES, gguf_values, k_blocks

IDS = {"ids": lambda t: t.name}


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _int(raw: np.ndarray, qtype: GGType, x: np.ndarray) -> np.ndarray:
    """ggml's integer product ``x @ W.T`` of each 2-D slice of ``x`` (the NumPy port)."""
    flat = x.reshape(-1, x.shape[-1])
    return int_product(raw, int(qtype), flat).reshape(x.shape[:-1] + (raw.shape[0],))


def _weight(ctx: ggopt.Context, qtype: GGType, raw: np.ndarray, name: str = "w") -> ggopt.Tensor:
    rows, rb = raw.shape
    return tensor_from_blocks(ctx, qtype, (rb // qtype.size * 256, rows), raw, name)


def _compute(build, qtype: GGType, raw: np.ndarray, inputs: list[np.ndarray],
             backend: gb.Backend) -> list[np.ndarray]:
    """``build(ctx, weight, *inputs)`` on ``backend`` (the CPU last in the scheduler), the weight
    in host memory over ``raw`` as a loader maps it; host copies of the results."""
    wctx, ctx = ggopt.Context(no_alloc=True), ggopt.Context()
    w = _weight(wctx, qtype, raw)
    ins = [ctx.new_tensor(F32 if a.dtype == np.float32 else GGType.I32, a.shape[::-1])
           for a in inputs]
    for t in ins:
        ggopt.set_input(t)
    outs = build(ctx, w, *ins)
    outs = [outs] if isinstance(outs, ggopt.Tensor) else list(outs)
    gf = ggopt.new_graph_custom(ctx, 256, False)
    for o in outs:
        ggopt.set_output(o)
        ggopt.build_forward_expand(gf, o)
    gb.alloc_ctx_tensors(ctx, backend)
    for t, a in zip(ins, inputs):
        gb.tensor_set(t, a)
    sched = gb.Scheduler([backend] if backend.is_host else [backend, gb.cpu_init()])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    return [gb.tensor_get(o) for o in outs]


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_mul_mat_forward_cpu_and_reference(qtype):
    raw = k_blocks(qtype, 37, 512, seed=1)
    w = gguf_values(raw, qtype)
    x = _f32(2, 5, 512, seed=2)
    cpu1, cpu2, ref = (_compute(ggopt.mul_mat, qtype, raw, [x], be)[0]
                       for be in (gb.cpu_init(1), gb.cpu_init(2), numpy_backend()))
    np.testing.assert_array_equal(cpu1.view(np.uint32), cpu2.view(np.uint32))
    want = _int(raw, qtype, x)  # ggml's integer product, bit for bit on both backends
    np.testing.assert_array_equal(cpu1.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(ref.view(np.uint32), want.view(np.uint32))
    np.testing.assert_allclose(cpu1, x @ w.T, rtol=0, atol=0.02 * np.abs(x @ w.T).max())



@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_backward_out_prod_is_g_times_the_dequantized_weight(qtype):
    raw = k_blocks(qtype, 40, 512, seed=5)
    w = gguf_values(raw, qtype)
    gy = _f32(7, 40, seed=6)

    def build(ctx, gt):  # the op the backward rule of mul_mat builds for d/dx
        return ggopt.out_prod(ctx, _weight(ctx, qtype, raw),
                              ggopt.transpose(ctx, ggopt.cont(ctx, gt)))

    (dx1,), (dx2,) = run(build, gy, n_threads=1), run(build, gy, n_threads=2)
    np.testing.assert_allclose(dx1, gy @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(dx1.view(np.uint32), dx2.view(np.uint32))


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_tied_embedding_and_output_and_cpy_to_f32(qtype):
    raw = k_blocks(qtype, 50, 256, seed=7)
    e = gguf_values(raw, qtype)
    ids = np.array([3, 49, 0, 3], np.int32)

    def build(ctx, emb, it):
        h = ggopt.get_rows(ctx, emb, it)
        full = ggopt.cpy(ctx, emb, ctx.new_tensor(F32, emb.ne))
        return h, ggopt.mul_mat(ctx, emb, h), full

    for backend in (gb.cpu_init(2), numpy_backend()):
        h, logits, full = _compute(build, qtype, raw, [ids], backend)
        np.testing.assert_array_equal(h, e[ids])
        np.testing.assert_array_equal(full.view(np.uint32), e.view(np.uint32))
        np.testing.assert_allclose(logits, _int(raw, qtype, e[ids]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_views_keep_whole_super_blocks(qtype):
    raw = k_blocks(qtype, 6, 512, seed=8)
    e = gguf_values(raw, qtype)
    ctx = ggopt.Context(no_alloc=True)
    w = _weight(ctx, qtype, raw)
    assert w.nb[:2] == (qtype.size, 2 * qtype.size) and w.nbytes() == raw.size
    rows = ggopt.view_2d(ctx, w, 512, 2, w.nb[1], 3 * w.nb[1])  # rows 3 and 4
    np.testing.assert_array_equal(rows.numpy(), raw[3:5])
    halves = ggopt.reshape_2d(ctx, w, 256, 12)  # each row as two rows of one super-block
    np.testing.assert_array_equal(halves.numpy(), raw.reshape(12, qtype.size))
    (got,) = run(lambda c, it: ggopt.get_rows(c, halves, it), np.array([11, 0], np.int32))
    np.testing.assert_array_equal(got, e.reshape(12, 256)[[11, 0]])
    for bad in (lambda: ggopt.view_2d(ctx, w, 128, 2, w.nb[1], 0),
                lambda: ggopt.reshape_2d(ctx, w, 32, 96),
                lambda: ctx.new_tensor(qtype, (32, 4)),
                lambda: tensor_from_blocks(ctx, qtype, (128, 2), raw[:2, :qtype.size], "half")):
        with pytest.raises(ShapeError, match="256"):
            bad()
    second = ggopt.view_2d(ctx, w, 256, 6, w.nb[1], qtype.size)  # each row's second block
    np.testing.assert_array_equal(second.numpy(), raw[:, qtype.size:])
    for offset, nb1 in ((10, w.nb[1]), (0, w.nb[1] + 5)):  # into the middle of a block
        with pytest.raises(ShapeError, match=f"whole {qtype.size}-byte blocks"):
            ggopt.view_2d(ctx, w, 256, 2, nb1, offset)


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_refusals_before_anything_runs(qtype):
    raw = k_blocks(qtype, 4, 256)
    ctx = ggopt.Context(no_alloc=True)
    w = _weight(ctx, qtype, raw)
    with pytest.raises(DTypeError, match="quantized tensor cannot be trained"):
        ggopt.set_param(w)
    assert not w.is_param
    x, dst = ctx.new_tensor(F32, (256, 4)), ctx.new_tensor(qtype, (256, 4))
    n = len(ctx.tensors)
    with pytest.raises(DTypeError, match="cannot quantize to it"):
        ggopt.cpy(ctx, x, dst)
    assert len(ctx.tensors) == n  # no cpy node was made
    for op in (lambda: ggopt.add(ctx, w, w), lambda: ggopt.mul_mat(ctx, x, w),
               lambda: ggopt.transpose(ctx, w), lambda: ggopt.rms_norm(ctx, w, 1e-5)):
        with pytest.raises(DTypeError):
            op()


@pytest.mark.parametrize("qtype", K_TYPES, **IDS)
def test_batched_product_in_ggml_order_takes_each_slice_s_row_count(qtype):
    """ggml picks vec_dot or its tiled matmul by each batch slice's rows (``ne11``), not by
    all of them: 4 slices of 4 rows are 4 vec_dot products, 2 of 9 two tiled ones; a flattened
    product of the first would round otherwise."""
    raw = k_blocks(qtype, 24, 512, seed=4, scale=0.01)
    for shape in ((4, 4, 512), (2, 9, 512)):
        x = _f32(*shape, seed=5)
        got = _compute(lambda c, w, t: ggopt.set_ggml_order(ggopt.mul_mat(c, w, t)), qtype, raw,
                       [x], gb.cpu_init(2))[0]
        want = np.empty(shape[:2] + (24,), np.float32)
        for i in range(shape[0]):
            go.mul_mat_quant(raw, int(qtype), x[i], want[i], 1)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        if shape[1] < 8:  # all the rows at once would be tiled
            flat = np.empty_like(want.reshape(-1, 24))
            go.mul_mat_quant(raw, int(qtype), x.reshape(-1, 512), flat, 1)
            assert not np.array_equal(flat.reshape(want.shape), want)
