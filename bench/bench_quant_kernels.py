"""ggml's integer products (``_quant_dot.mul_mat_q8``) on each kernel this CPU has, forced with
``_quant_dot.set_kernel`` (amx, vnni, avxvnni, avx2, portable: the same bits), beside the F32
product of the same shape in the same run: SmolLM2's FFN shapes with 256 tokens, 576 -> 1536
(Q8_0, Q4_1) and 1536 -> 576 (Q8_0, Q4_1, Q4_K), with the weight's panels packed once
(``pack_weight``, as a kept weight mapped from its file) and decoded per call.

Rows per group: ``f32`` (ggopt's F32 mul_mat, a one-node graph), then one row per
kernel, storing ``ratio_vs_f32`` (above 1: faster than F32) and GOP/s in ``extra_info``; every
kernel's output is checked to be the first kernel's, byte for byte. ``GGOPT_BENCH_THREADS``
threads (default 2); on a busy machine run it on one thread with
``--benchmark-timer=time.thread_time`` (docs/quantized-products.md, "Kernels without AVX-512").
"""

from __future__ import annotations

import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt import quants
from ggopt._kernels import _quant_dot
from ggopt.types import F32, GGType
from tools.kquants import k_blocks

N = 256
#: (input size K, output size M) and the weight types of each shape
SHAPES = {"ffn_up": ((576, 1536), ["Q8_0", "Q4_1"]),
          "ffn_down": ((1536, 576), ["Q8_0", "Q4_1", "Q4_K"])}
GROUPS = [(shape, t, packed) for shape, (_, types) in SHAPES.items() for t in types
          for packed in (True, False)]
IMPLS = ["f32", *_quant_dot.available()]
# The first output of each group, which every kernel must give byte for byte.
_FIRST: dict[tuple[str, str, bool], bytes] = {}


def _weight(qtype: GGType, K: int, M: int) -> np.ndarray:
    """The raw rows of an M x K weight of ``qtype``."""
    if not qtype.can_quantize:  # the K-quants: random super-blocks (no quantizer to use)
        return k_blocks(qtype, M, K, scale=1e-3)
    w = (np.random.default_rng(0).standard_normal((M, K)) * 0.05).astype(np.float32)
    return quants.quantize(w, qtype)


def _f32_product(w: np.ndarray, x: np.ndarray):
    """(step, output tensor) of ``x @ w.T`` as ggopt's CPU backend computes an F32 mul_mat (a
    one-node graph on the scheduler, ``bench_threads`` threads)."""
    ctx = ggopt.Context()
    tw, tx = ctx.new_tensor(F32, w.shape[::-1]), ctx.new_tensor(F32, x.shape[::-1])
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(tw, w)
    gb.tensor_set(tx, x)
    cctx = ggopt.Context()
    out = ggopt.mul_mat(cctx, tw, tx)
    ggopt.set_output(out)
    gf = ggopt.new_graph_custom(cctx, 16, False)
    ggopt.build_forward_expand(gf, out)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    return (lambda: sched.graph_compute(gf)), out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape,qtype,packed", GROUPS,
                         ids=[f"{s}-{t}-{'packed' if p else 'per_call'}" for s, t, p in GROUPS])
def test_quantized_kernel(benchmark, ratio_to, bench_threads, shape, qtype, packed, impl):
    (K, M), _ = SHAPES[shape]
    benchmark.group = (f"mul_mat_q8 {shape} W[{K}x{M}] {qtype} x {N} tokens, "
                       f"{'packed panels' if packed else 'panels per call'}")
    x = np.random.default_rng(1).standard_normal((N, K)).astype(np.float32)
    out = np.empty((N, M), np.float32)
    rounds = {"warmup_rounds": 3, "rounds": 3 if impl == "portable" else 40}
    qt = GGType[qtype]
    raw = _weight(qt, K, M)
    if impl == "f32":
        w = quants.dequantize(raw, qt)
        step, y = _f32_product(w, x)
        benchmark.pedantic(step, **rounds)
        np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=1e-3, atol=1e-3)
        ratio_to("f32")
        return
    panels = None
    if packed:
        panels = np.empty(_quant_dot.packed_shape(int(qt), M, K), np.uint8)
        _quant_dot.pack_weight(raw, int(qt), panels, bench_threads)
    _quant_dot.set_kernel(impl)
    try:
        benchmark.pedantic(_quant_dot.mul_mat_q8, args=(raw, int(qt), x, out, bench_threads),
                           kwargs={"packed": panels}, **rounds)
    finally:
        _quant_dot.set_kernel("auto")
    assert out.tobytes() == _FIRST.setdefault((shape, qtype, packed), out.tobytes())
    if benchmark.stats is not None:
        benchmark.extra_info["gops"] = round(2 * K * M * N / benchmark.stats.stats.median / 1e9,
                                             2)
    ratio_to(impl, f32=None)
