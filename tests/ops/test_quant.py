"""Graphs with quantized tensors: mul_mat / get_rows / cpy on a quantized weight on the CPU
backend and the NumPy array backend (the reference: dequantize with gguf.quants, then F32),
finite-difference gradients through x for every quantized type, a tied embedding/output
weight, and the refusals (a quantized PARAM, an op without a quantized kernel, a gradient into
a quantized tensor, partial blocks) before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

import ggopt
from ggopt import backend as gb
from ggopt import quants
from ggopt._kernels import _quant_dot
from ggopt.backend.array.backend import numpy_backend
from ggopt.backend.array.ops.quant import int_product
from ggopt.errors import DTypeError, GgoptError, ShapeError
from ggopt.quants import tensor_from_blocks
from ggopt.types import F32, GGType
from tests.support.helpers import product_graph, run

TYPES = [GGType.Q4_0, GGType.Q4_1, GGType.Q5_0, GGType.Q5_1, GGType.Q8_0]


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _blocks(qtype: GGType, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw blocks of random rows and their dequantized values."""
    raw = gq.quantize(_f32(rows, cols, seed=seed), GQT(int(qtype)))
    return raw, gq.dequantize(raw, GQT(int(qtype)))


def _int(raw: np.ndarray, qtype: GGType, x: np.ndarray) -> np.ndarray:
    """ggml's integer product ``x @ W.T`` of each 2-D slice of ``x`` (the NumPy port)."""
    flat = x.reshape(-1, x.shape[-1])
    return int_product(raw, int(qtype), flat).reshape(x.shape[:-1] + (raw.shape[0],))


def _weight(ctx: ggopt.Context, qtype: GGType, raw: np.ndarray, name: str = "w") -> ggopt.Tensor:
    rows, rb = raw.shape
    return tensor_from_blocks(ctx, qtype, (rb // qtype.size * 32, rows), raw, name)


def _compute(build, inputs: list[np.ndarray], backend: gb.Backend,
             weights: tuple[tuple[GGType, np.ndarray], ...] = ()) -> list[np.ndarray]:
    """``build(ctx, *weight tensors, *input tensors)`` computed on ``backend`` (with the CPU
    as the scheduler's last backend), every tensor allocated there; host copies of the
    results. ``weights``: (type, raw blocks of shape (rows, row bytes))."""
    ctx = ggopt.Context()
    ws = [ctx.new_tensor(q, (raw.shape[1] // q.size * 32, raw.shape[0])) for q, raw in weights]
    ins = [ctx.new_tensor(F32 if a.dtype == np.float32 else GGType.I32, a.shape[::-1])
           for a in inputs]
    for t in ins:
        ggopt.set_input(t)
    outs = build(ctx, *ws, *ins)
    outs = [outs] if isinstance(outs, ggopt.Tensor) else list(outs)
    gf = ggopt.new_graph_custom(ctx, 256, False)
    for o in outs:
        ggopt.set_output(o)
        ggopt.build_forward_expand(gf, o)
    gb.alloc_ctx_tensors(ctx, backend)
    for t, a in zip(ws + ins, [raw for _, raw in weights] + inputs):
        gb.tensor_set(t, a)
    sched = gb.Scheduler([backend] if backend.is_host else [backend, gb.cpu_init()])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    return [gb.tensor_get(o) for o in outs]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_mul_mat_forward_cpu_and_reference(qtype):
    raw, w = _blocks(qtype, 37, 96)
    x = _f32(2, 5, 96, seed=1)

    cpu1, cpu2, ref = (_compute(ggopt.mul_mat, [x], be, ((qtype, raw),))[0]
                       for be in (gb.cpu_init(1), gb.cpu_init(2), numpy_backend()))
    np.testing.assert_array_equal(cpu1.view(np.uint32), cpu2.view(np.uint32))
    want = _int(raw, qtype, x)  # ggml's integer product, bit for bit on both backends
    np.testing.assert_array_equal(cpu1.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(ref.view(np.uint32), want.view(np.uint32))
    np.testing.assert_allclose(cpu1, x @ w.T, rtol=0, atol=0.02 * np.abs(x @ w.T).max())



def test_gradient_through_x_is_the_f32_products_of_the_dequantized_weight():
    """The backward out_prod of a quantized weight equals the F32 weight's, to rounding."""
    raw, w = _blocks(GGType.Q4_1, 40, 96, seed=4)
    x = _f32(7, 96, seed=5)
    gy = _f32(7, 40, seed=6)

    def build(ctx, xt, gt):  # d(sum(y * g))/dx through the backward rule's op
        y = ggopt.mul_mat(ctx, _weight(ctx, GGType.Q4_1, raw), xt)
        return ggopt.out_prod(ctx, _weight(ctx, GGType.Q4_1, raw),
                              ggopt.transpose(ctx, ggopt.cont(ctx, gt))), y

    dx, y = run(build, x, gy)
    np.testing.assert_allclose(dx, gy @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(y, _int(raw, GGType.Q4_1, x))


@pytest.mark.parametrize("qtype", [GGType.Q8_0, GGType.Q4_1], ids=lambda t: t.name)
def test_tied_embedding_and_output(qtype):
    """get_rows(E, ids) as the input embedding, mul_mat(E, h) as the output product."""
    raw, e = _blocks(qtype, 50, 64, seed=7)
    ids = np.array([3, 49, 0, 3], np.int32)

    def build(ctx, emb, it):
        h = ggopt.get_rows(ctx, emb, it)
        return h, ggopt.mul_mat(ctx, emb, h)

    for backend in (gb.cpu_init(2), numpy_backend()):
        h, logits = _compute(build, [ids], backend, ((qtype, raw),))
        np.testing.assert_array_equal(h, e[ids])
        np.testing.assert_allclose(logits, _int(raw, qtype, e[ids]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_cpy_dequantizes_and_quantizes_as_ggml(qtype):
    x = _f32(3, 64, seed=8)
    ref = gq.quantize(x, GQT(int(qtype)))

    def quantize(ctx, xt):
        return ggopt.cpy(ctx, xt, ctx.new_tensor(qtype, (64, 3)))

    def roundtrip(ctx, xt):
        q = quantize(ctx, xt)
        return ggopt.cpy(ctx, q, ctx.new_tensor(F32, (64, 3)))

    for backend in (gb.cpu_init(2), numpy_backend()):
        blocks, back = _compute(lambda c, t: (quantize(c, t), roundtrip(c, t)), [x], backend)
        np.testing.assert_array_equal(blocks, ref)
        np.testing.assert_array_equal(back, gq.dequantize(ref, GQT(int(qtype))))


def test_quantized_tensor_layout_and_raw_views():
    ctx = ggopt.Context(no_alloc=False)
    t = ctx.new_tensor(GGType.Q4_1, (64, 3, 2))
    assert t.nb == (20, 40, 120, 240)
    assert t.nbytes() == 240
    assert t.numpy().shape == (2, 3, 40) and t.numpy().dtype == np.uint8
    raw = gq.quantize(_f32(6, 64), GQT.Q4_1).reshape(2, 3, 40)
    gb.tensor_set(t, raw)
    np.testing.assert_array_equal(gb.tensor_get(t), raw)
    row = ggopt.view_2d(ctx, t, 64, 2, t.nb[1], t.nb[1])  # rows 1 and 2 of slice 0
    np.testing.assert_array_equal(row.numpy(), raw[0, 1:3])
    flat = ggopt.reshape_2d(ctx, t, 64, 6)
    np.testing.assert_array_equal(flat.numpy(), raw.reshape(6, 40))


def test_refusals_before_anything_runs():
    ctx = ggopt.Context()
    raw, _ = _blocks(GGType.Q8_0, 4, 64)
    w = _weight(ctx, GGType.Q8_0, raw)
    x = ctx.new_tensor(F32, (64, 2))
    with pytest.raises(DTypeError, match="quantized tensor cannot be trained"):
        ggopt.set_param(w)
    assert not w.is_param
    with pytest.raises(ShapeError, match="multiple of its block size 32"):
        ctx.new_tensor(GGType.Q4_0, (48, 2))
    with pytest.raises(ShapeError, match="'partial'.*multiple of its block size"):
        tensor_from_blocks(ctx, GGType.Q4_0, (40, 2), bytes(40), "partial")
    with pytest.raises(ggopt.StateError, match="no_alloc=True"):
        tensor_from_blocks(ggopt.Context(no_alloc=False), GGType.Q8_0, (64, 4), raw, "own")
    with pytest.raises(ShapeError, match="'cut'.*truncated"):
        tensor_from_blocks(ctx, GGType.Q8_0, (64, 4), raw.reshape(-1)[:-1], "cut")
    for op in (lambda: ggopt.add(ctx, w, w), lambda: ggopt.rms_norm(ctx, w, 1e-5),
               lambda: ggopt.soft_max(ctx, w), lambda: ggopt.mul_mat(ctx, x, w),
               lambda: ggopt.transpose(ctx, w), lambda: ggopt.sum(ctx, w)):
        with pytest.raises(DTypeError):
            op()
    with pytest.raises(ShapeError, match="whole"):
        ggopt.view_2d(ctx, w, 16, 4, w.nb[1], 0)
    with pytest.raises(DTypeError, match="to or from F32"):
        ggopt.cpy(ctx, w, ctx.new_tensor(GGType.Q4_0, (64, 4)))


def test_no_gradient_flows_into_a_quantized_tensor():
    """A quantized tensor made from a parameter by cpy is still never trained: building the
    backward graph refuses, naming the tensor's type."""
    ctx = ggopt.Context()
    p = ctx.new_tensor(F32, (64, 3))
    ggopt.set_param(p)
    q = ggopt.cpy(ctx, p, ctx.new_tensor(GGType.Q8_0, (64, 3)))
    x = ctx.new_tensor(F32, (64, 2))
    ggopt.set_input(x)
    loss = ggopt.sum(ctx, ggopt.mul_mat(ctx, q, x))
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(ctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    with pytest.raises(GgoptError, match="needs a gradient but is Q8_0"):
        ggopt.build_backward_expand(ctx, gf, None)


def test_out_prod_of_a_quantized_weight_has_no_gradient_to_b():
    ctx = ggopt.Context()
    raw, _ = _blocks(GGType.Q8_0, 4, 64)
    b = ctx.new_tensor(F32, (2, 4))
    ggopt.set_param(b)
    loss = ggopt.sum(ctx, ggopt.out_prod(ctx, _weight(ctx, GGType.Q8_0, raw), b))
    ggopt.set_loss(loss)
    gf = ggopt.new_graph_custom(ctx, 64, True)
    ggopt.build_forward_expand(gf, loss)
    with pytest.raises(DTypeError, match="quantized src1"):
        ggopt.build_backward_expand(ctx, gf, None)


def test_a_tensor_over_read_only_bytes_is_not_copied_and_computes(tmp_path):
    raw, w = _blocks(GGType.Q4_0, 8, 64, seed=9)
    path = tmp_path / "blocks.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    x = _f32(3, 64, seed=10)
    ctx = ggopt.Context()
    wt = tensor_from_blocks(ctx, GGType.Q4_0, (64, 8), mapped, "mapped")
    assert np.shares_memory(wt.numpy(), mapped) and not wt.numpy().flags.writeable
    xt = ctx.new_tensor(F32, (64, 3))
    ggopt.set_input(xt)
    y = ggopt.mul_mat(ctx, wt, xt)
    ggopt.set_output(y)
    gf = ggopt.new_graph_custom(ctx, 16, False)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init(2)
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(xt, x)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    sched.graph_compute(gf)
    np.testing.assert_array_equal(y.numpy(), _int(np.asarray(mapped).reshape(8, -1),
                                                  GGType.Q4_0, x))
    np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=0, atol=0.02 * np.abs(x @ w.T).max())


def _mapped_product(path, qtype: GGType, rows: int, cols: int, x: np.ndarray):
    """``y = mul_mat(w, x)`` over the blocks mapped read-only from ``path``; (graph parts)."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    ctx = ggopt.Context()
    wt = tensor_from_blocks(ctx, qtype, (cols, rows), mapped, "mapped")
    xt = ctx.new_tensor(F32, (cols, x.shape[0]))
    ggopt.set_input(xt)
    y = ggopt.mul_mat(ctx, wt, xt)
    ggopt.set_output(y)
    gf = ggopt.new_graph_custom(ctx, 16, False)
    ggopt.build_forward_expand(gf, y)
    cpu = gb.cpu_init(2)
    gb.alloc_ctx_tensors(ctx, cpu)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    return ctx, wt, xt, y, gf, sched


def test_read_only_weights_keep_their_panels_and_writable_ones_never_go_stale(tmp_path):
    """A weight mapped read-only is decoded once (its panels kept with its buffer, freed with
    it); the products are the integer products bit for bit on every call (1 and 5 rows). A
    writable weight keeps nothing: after tensor_set the products are the new weight's."""
    import gc

    from ggopt.backend.cpu.ops import quant as cpu_quant

    gc.collect()
    before = cpu_quant.panels_bytes()
    raw, _ = _blocks(GGType.Q4_1, 40, 64, seed=11)
    raw.tofile(tmp_path / "w.bin")
    x = _f32(5, 64, seed=12)
    ctx, wt, xt, y, gf, sched = _mapped_product(tmp_path / "w.bin", GGType.Q4_1, 40, 64, x)
    shape = _quant_dot.packed_shape(int(GGType.Q4_1), 40, 64)
    for step in range(3):
        gb.tensor_set(xt, x + step)
        sched.graph_compute(gf)
        np.testing.assert_array_equal(y.numpy().view(np.uint32),
                                      _int(raw, GGType.Q4_1, x + step).view(np.uint32))
        assert cpu_quant.panels_bytes() - before == shape[0] * shape[1]
    del ctx, wt, xt, y, gf, sched
    gc.collect()
    assert cpu_quant.panels_bytes() == before  # freed with the mapped buffer

    ctx = ggopt.Context()
    wt = ctx.new_tensor(GGType.Q4_1, (64, 40))
    xt = ctx.new_tensor(F32, (64, 1))
    ggopt.set_input(xt)
    y = ggopt.mul_mat(ctx, wt, xt)
    ggopt.set_output(y)
    gf = ggopt.new_graph_custom(ctx, 16, False)
    ggopt.build_forward_expand(gf, y)
    gb.alloc_ctx_tensors(ctx, gb.cpu_init(2))
    sched = gb.Scheduler([gb.cpu_init(2)])
    sched.alloc_graph(gf)
    gb.tensor_set(xt, x[:1])
    for weights in (raw, _blocks(GGType.Q4_1, 40, 64, seed=13)[0]):  # written into the same memory
        gb.tensor_set(wt, weights)
        sched.graph_compute(gf)
        np.testing.assert_array_equal(y.numpy().reshape(1, 40).view(np.uint32),
                                      _int(weights, GGType.Q4_1, x[:1]).view(np.uint32))
    assert cpu_quant.panels_bytes() == before


def test_only_few_row_products_keep_panels_and_wide_ones_use_those_kept(tmp_path):
    """Products of PANEL_ROWS or more rows (a fine-tune's) decode a read-only weight per call
    and keep nothing; one of fewer rows (a generated token's) keeps its panels, which later
    wide products use: the same bits every way."""
    import gc

    from ggopt.backend.cpu.ops import quant as cpu_quant

    gc.collect()
    before = cpu_quant.panels_bytes()
    raw, _ = _blocks(GGType.Q8_0, 40, 64, seed=14)
    raw.tofile(tmp_path / "w.bin")
    wide = _f32(cpu_quant.PANEL_ROWS, 64, seed=15)
    ctx, wt, xt, y, gf, sched = _mapped_product(tmp_path / "w.bin", GGType.Q8_0, 40, 64, wide)
    xf, yf, gf_few, sched_few = product_graph(wt, cpu_quant.PANEL_ROWS - 1)
    gb.tensor_set(xt, wide)
    gb.tensor_set(xf, wide[1:])
    shape = _quant_dot.packed_shape(int(GGType.Q8_0), 40, 64)
    for graph, s, kept in ((gf, sched, 0), (gf, sched, 0), (gf_few, sched_few, 1), (gf, sched, 1)):
        s.graph_compute(graph)
        assert cpu_quant.panels_bytes() - before == kept * shape[0] * shape[1]
        np.testing.assert_array_equal(y.numpy().view(np.uint32),
                                      _int(raw, GGType.Q8_0, wide).view(np.uint32))
        if graph is gf_few:
            np.testing.assert_array_equal(yf.numpy().view(np.uint32),
                                          _int(raw, GGType.Q8_0, wide[1:]).view(np.uint32))


_PEAKS = """
import json, resource, sys
import numpy as np
import ggopt
from ggopt import backend as gb
from ggopt.quants import tensor_from_blocks
from ggopt.types import GGType
from tests.support.helpers import product_graph

rows, cols = 8192, 4096
mapped = np.memmap(sys.argv[1], dtype=np.uint8, mode="r").reshape(rows, -1)
ctx = ggopt.Context()
wt = tensor_from_blocks(ctx, GGType.Q4_1, (cols, rows), mapped, "mapped")
graphs = []
for n in (256, 1):
    xt, y, gf, sched = product_graph(wt, n)
    gb.tensor_set(xt, np.ones((n, cols), np.float32))
    graphs.append((sched, gf, y))
int(np.asarray(mapped).sum())  # the file's pages resident before the first peak
def rss():  # (now, peak) in bytes
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * resource.getpagesize()
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
sizes = [rss()]
for sched, gf, y in (graphs[0], graphs[0], graphs[1], graphs[0]):
    sched.graph_compute(gf)
    sizes.append(rss())
print(json.dumps(sizes))
"""


def test_a_wide_product_of_a_mapped_weight_does_not_grow_the_process_by_its_panels(tmp_path):
    """RSS of a process (its own, in a subprocess): 256-row products of an 8192 x 4096 Q4_1
    weight mapped from its file raise its peak and what it holds by far less than the
    weight's 46 MB of panels; the first one-row product adds them (kept), after which the
    wide product adds nothing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    rows, cols = 8192, 4096
    blocks = np.random.default_rng(16).integers(0, 256, (rows, cols // 32, 20), np.uint8)
    blocks[..., 0:4] = np.array([0.01, -0.05], np.float16).view(np.uint8)  # d, m
    blocks.tofile(tmp_path / "w.bin")
    panels = np.prod(_quant_dot.packed_shape(int(GGType.Q4_1), rows, cols))
    out = subprocess.run([sys.executable, "-c", _PEAKS, str(tmp_path / "w.bin")],
                         capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    (r0, p0), _, (r_wide, p_wide), (r_one, _), (r_wide3, _) = json.loads(
        out.stdout.strip().splitlines()[-1])
    # what the wide products add: their 256 x 8192 output and activations (17 MB)
    assert p_wide - p0 < 0.5 * panels, f"peak: {(p_wide - p0) / 1e6:.1f} MB more"
    assert r_wide - r0 < 0.5 * panels, f"held: {(r_wide - r0) / 1e6:.1f} MB more"
    assert r_one - r_wide > 0.9 * panels  # the one-row product keeps the panels
    assert r_wide3 - r_one < 0.05 * panels


def test_tensor_from_blocks_refuses_strided_arrays_and_non_int_types():
    """A strided uint8 array was silently copied (the tensor no longer its memory), a strided
    F32 one a raw NumPy ValueError; a float or bool type id was taken as an int."""
    raw, _ = _blocks(GGType.Q8_0, 8, 64)
    with pytest.raises(ShapeError, match="C-contiguous"):
        tensor_from_blocks(ggopt.Context(), GGType.Q8_0, (64, 4), raw[::2], "strided")
    with pytest.raises(ShapeError, match="C-contiguous"):
        tensor_from_blocks(ggopt.Context(), F32, (2, 4), np.zeros((4, 4), np.float32)[:, ::2])
    for bad in (float(GGType.Q8_0), True):
        with pytest.raises(DTypeError, match="unknown tensor type"):
            tensor_from_blocks(ggopt.Context(), bad, (64, 8), raw, "typed")


def test_dequantize_shape_whose_size_wraps_int64():
    """The expected size was an int64 product: 2**62 x 4 rows wrapped to 0 bytes, passed the
    size check for empty data and failed in NumPy's reshape (a raw ValueError)."""
    with pytest.raises(ShapeError, match="332041393326771929088 bytes, got 0"):
        quants.dequantize(np.zeros(0, np.uint8), GGType.Q4_0, (2**62, 4, 32))
