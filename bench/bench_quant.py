"""Products of a quantized weight (``_kernels/_quant.pyx``) beside the F32 product, at the
SmolLM2 FFN shape (576 -> 1536) with 256 tokens (a LoRA batch of 1 x 256).

Each group runs the F32 graph first, then the Q8_0 and Q4_1 graphs (one-node graphs computed
by the scheduler on ``GGOPT_BENCH_THREADS`` threads, default 2); the quantized rows store their
speed relative to F32 (``ratio_vs_f32``, above 1 is faster) and their GFLOP/s in
``extra_info``. Run with ``pytest bench/bench_quant.py`` (see bench/README.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as GQT

import ggopt
from ggopt import backend as gb
from ggopt.types import F32, GGType

pytestmark = pytest.mark.usefixtures("bench_threads")

K, M, N = 576, 1536, 256
FLOP = 2 * K * M * N
ROUNDS = {"warmup": True, "warmup_iterations": 3, "min_rounds": 10}
IMPLS = ["f32", "q8_0", "q4_1"]


def _arrays():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
    return w, rng.standard_normal((N, K)).astype(np.float32), \
        rng.standard_normal((N, M)).astype(np.float32)


def _graph(impl: str, case: str):
    """(step, output tensor, expected result) of one product on the CPU backend."""
    w, x, g = _arrays()
    qtype = None if impl == "f32" else GGType[impl.upper()]
    data = w if qtype is None else gq.quantize(w, GQT(int(qtype)))
    wd = w if qtype is None else gq.dequantize(data, GQT(int(qtype)))
    ctx = ggopt.Context()
    tw = ctx.new_tensor(qtype or F32, (K, M))
    tx = ctx.new_tensor(F32, (K, N) if case == "forward" else (M, N))
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(tw, data)
    gb.tensor_set(tx, x if case == "forward" else g)
    cctx = ggopt.Context()
    if case == "forward":  # y = x W^T
        out, expected = ggopt.mul_mat(cctx, tw, tx), x @ wd.T
    else:  # dx = g W: mul_mat's backward rule for x
        out, expected = ggopt.out_prod(cctx, tw, ggopt.transpose(cctx, tx)), g @ wd
    ggopt.set_output(out)
    gf = ggopt.new_graph_custom(cctx, 16, False)
    ggopt.build_forward_expand(gf, out)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    return (lambda: sched.graph_compute(gf)), out, expected


@pytest.mark.benchmark(**ROUNDS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["forward", "grad_x"])
def test_quantized_product(benchmark, ratio_to, case, impl):
    benchmark.group = f"mul_mat {case} W[{K}x{M}] x {N} tokens"
    step, out, expected = _graph(impl, case)
    benchmark(step)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-3, atol=1e-3)
    if benchmark.stats is not None:
        benchmark.extra_info["gflops"] = round(FLOP / benchmark.stats.stats.median / 1e9, 2)
    ratio_to(impl, f32=None)
