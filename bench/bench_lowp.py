"""Products of a BF16 weight (``_kernels/_lowp.pyx``: activations rounded to BF16, F32 sums)
beside ggopt's F32 product (oneMKL ``sgemm``) and PyTorch's F32 and BF16 ``matmul`` in the same
run, at SmolLM2's shapes with 256 tokens: ffn_up (576 -> 1536), ffn_down (1536 -> 576), the
attention projections (576 -> 576) and the output head (576 -> 49152); ``grad_x`` is the
input gradient through the frozen weight (``out_prod``, mul_mat's backward rule for x).

``bf16`` is this CPU's kernel with the weight's panels packed once (a constant weight, as a
frozen base), ``bf16_fma`` / ``bf16_dpbf16`` / ``bf16_avx2`` force a kernel,
``bf16_unpacked`` packs the weight on every product (the packing cache off).
``test_cpy_f32_to_bf16`` times the F32 -> BF16 ``cpy`` of the output head's 576 x 49152
matrix (a full bf16 fine-tune's per-step rounding) against the NumPy rule.

ggopt's rows are one-node graphs computed by the scheduler on ``GGOPT_BENCH_THREADS`` threads
(default 2); PyTorch's run on as many (``torch.set_num_threads``). Every row stores its GFLOP/s
in ``extra_info``; the BF16 row its ratio to ggopt's F32 row (target 2.0) and to PyTorch's BF16
row (target 0.9), the PyTorch rows being measured first. Run with
``pytest bench/bench_lowp.py`` (see bench/README.md).
"""

from __future__ import annotations

from collections.abc import Callable

import ggopt._kernels._lowp as _lowp
import numpy as np
import pytest

import ggopt
from ggopt import backend as gb
from ggopt.lowp import bf16_from_f32, round_to
from ggopt.types import BF16, F32

pytestmark = pytest.mark.usefixtures("bench_threads")

N = 256
ROUNDS = {"warmup": True, "warmup_iterations": 3, "min_rounds": 10}
#: (input size K, output size M)
SHAPES = {"ffn_up": (576, 1536), "ffn_down": (1536, 576), "attn": (576, 576),
          "output": (576, 49152)}
IMPLS = ["torch_f32", "torch_bf16", "f32", "bf16", "bf16_fma", "bf16_dpbf16", "bf16_avx2",
         "bf16_unpacked"]
#: the kernel an ``impl`` row forces (None: this CPU's choice)
FORCED = {"bf16_fma": "fma", "bf16_dpbf16": "dpbf16", "bf16_avx2": "avx2"}
CASES = [("forward", s) for s in SHAPES] + [("grad_x", "ffn_up")]


def _operands(case: str, K: int, M: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
    return w, rng.standard_normal((N, K if case == "forward" else M)).astype(np.float32)


def _ggopt(impl: str, case: str, w: np.ndarray, x: np.ndarray) -> tuple[Callable[[], None],
                                                                       ggopt.Tensor]:
    M, K = w.shape
    ctx = ggopt.Context()
    lowp = impl.startswith("bf16")
    tw = ctx.new_tensor(BF16 if lowp else F32, (K, M))
    tx = ctx.new_tensor(F32, (x.shape[1], N))
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(tw, bf16_from_f32(w) if lowp else w)
    gb.tensor_set(tx, x)
    cctx = ggopt.Context()
    if case == "forward":
        out = ggopt.mul_mat(cctx, tw, tx)
    else:
        out = ggopt.out_prod(cctx, tw, ggopt.transpose(cctx, tx))
    ggopt.set_output(out)
    gf = ggopt.new_graph_custom(cctx, 16, False)
    ggopt.build_forward_expand(gf, out)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    from ggopt.backend.cpu.ops.lowp import PACKED

    def forced() -> None:  # a kernel forced, whichever this CPU would pick; or no packing cache
        _lowp.set_kernel(FORCED.get(impl))
        was, PACKED.enabled = PACKED.enabled, impl != "bf16_unpacked"
        try:
            sched.graph_compute(gf)
        finally:
            _lowp.set_kernel(None)
            PACKED.enabled = was

    return forced, out


def _torch(impl: str, case: str, w: np.ndarray, x: np.ndarray, n_threads: int
           ) -> Callable[[], object]:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(n_threads)
    dtype = torch.bfloat16 if impl == "torch_bf16" else torch.float32
    tw, tx = torch.from_numpy(w).to(dtype), torch.from_numpy(x).to(dtype)
    if case == "forward":
        return lambda: torch.matmul(tx, tw.T)
    return lambda: torch.matmul(tx, tw)


@pytest.mark.benchmark(**ROUNDS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case,shape", CASES, ids=[f"{c}-{s}" for c, s in CASES])
def test_bf16_product(benchmark, ratio_to, bench_threads, case, shape, impl):
    K, M = SHAPES[shape]
    benchmark.group = f"{case} {shape} W[{K}x{M}] x {N} tokens"
    w, x = _operands(case, K, M)
    if impl in FORCED and FORCED[impl] not in _lowp.available():
        pytest.skip(f"this CPU cannot run the {FORCED[impl]} kernel")
    if impl.startswith("torch"):
        benchmark(_torch(impl, case, w, x, bench_threads))
    else:
        step, out = _ggopt(impl, case, w, x)
        benchmark(step)
        wr = round_to(BF16, w) if impl.startswith("bf16") else w
        xr = round_to(BF16, x) if impl.startswith("bf16") else x
        want = xr.astype(np.float64) @ (wr.T if case == "forward" else wr).astype(np.float64)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    if benchmark.stats is not None:
        benchmark.extra_info["gflops"] = round(2 * K * M * N / benchmark.stats.stats.median
                                               / 1e9, 1)
        benchmark.extra_info["gflops_best"] = round(2 * K * M * N / benchmark.stats.stats.min
                                                    / 1e9, 1)
    if impl.startswith("bf16"):
        ratio_to(impl, f32=2.0, torch_bf16=0.9, torch_f32=None)
    else:
        ratio_to(impl, torch_f32=None)


@pytest.mark.benchmark(**ROUNDS)
@pytest.mark.parametrize("impl", ["numpy", "cpy"])
def test_cpy_f32_to_bf16(benchmark, ratio_to, impl):
    """The F32 -> BF16 rounding of SmolLM2's 576 x 49152 embedding: the graph's cpy (C, on
    the bench threads) against ``ggopt.lowp.bf16_from_f32`` (NumPy), the same bits."""
    benchmark.group = "cpy F32 -> BF16 576 x 49152"
    x = np.random.default_rng(0).standard_normal((49152, 576)).astype(np.float32)
    if impl == "numpy":
        benchmark(bf16_from_f32, x)
        ratio_to(impl)
        return
    ctx = ggopt.Context()
    src = ctx.new_tensor(F32, (576, 49152))
    cpu = gb.cpu_init()
    gb.alloc_ctx_tensors(ctx, cpu)
    gb.tensor_set(src, x)
    cctx = ggopt.Context()
    out = ggopt.cpy(cctx, src, cctx.new_tensor(BF16, (576, 49152)))
    ggopt.set_output(out)
    gf = ggopt.new_graph_custom(cctx, 16, False)
    ggopt.build_forward_expand(gf, out)
    sched = gb.Scheduler([cpu])
    sched.alloc_graph(gf)
    benchmark(lambda: sched.graph_compute(gf))
    np.testing.assert_array_equal(out.numpy().view(np.uint16), bf16_from_f32(x))
    ratio_to(impl, numpy=None)
