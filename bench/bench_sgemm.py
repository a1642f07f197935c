"""What the oneMKL dependency buys: one product on one thread through ``GemmPlan``, on each
installed ``sgemm`` (NumPy's ILP64 OpenBLAS first, oneMKL's after), SmolLM2's shapes at 256
tokens and MNIST-FC's at batch 500, in each layout a training step uses.

Rows per group: ``openblas`` then ``mkl``; the ``mkl`` row stores ``ratio_vs_openblas`` (above
1: oneMKL is faster) in ``extra_info``. No target: the measurement behind docs/f32-products.md
(why ``mkl`` stays a dependency). Each row is the same plan on the same arrays, the library
switched with ``_gemm.use_ilp64_sgemm``; the process's choice is restored after.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggopt._kernels import _gemm
from ggopt.backend.cpu import blas
from ggopt.backend.cpu.blas import SerialBlas

# rows x K x outputs of mul_mat (x @ W^T)
SHAPES = {"smollm2_up": (256, 576, 1536), "smollm2_down": (256, 1536, 576),
          "smollm2_q": (256, 576, 576), "smollm2_kv": (256, 576, 192),
          "smollm2_output": (256, 576, 49152), "mnist_fc1": (500, 784, 500),
          "mnist_fc2": (500, 500, 10)}
LAYOUTS = ("fwd", "dX", "dW")  # x @ W^T, dC @ W, dC^T @ X


def _operands(n: int, k: int, m: int, layout: str) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    if layout == "fwd":
        w = rng.standard_normal((m, k), dtype=np.float32)
        return rng.standard_normal((n, k), dtype=np.float32), w.T, np.empty((n, m), np.float32)
    dc = rng.standard_normal((n, m), dtype=np.float32)
    if layout == "dX":
        return dc, rng.standard_normal((m, k), dtype=np.float32), np.empty((n, k), np.float32)
    return dc.T, rng.standard_normal((n, k), dtype=np.float32), np.empty((m, k), np.float32)


@pytest.mark.parametrize("impl", ["openblas", "mkl"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sgemm_one_thread(benchmark, ratio_to, shape, layout, impl):
    address = blas.sgemm_address(impl)
    if address is None:
        pytest.skip(f"{impl} is not installed here")
    benchmark.group = f"sgemm {shape} {layout}"
    x, y, out = _operands(*SHAPES[shape], layout)
    chosen = {v: k for k, v in blas.BLAS_NAMES.items()}[blas.products_blas()]
    _gemm.use_ilp64_sgemm(address)
    try:
        plan = _gemm.GemmPlan()
        assert plan.add(x, y, out)
        with SerialBlas():
            benchmark.pedantic(plan.run, args=(1,), warmup_rounds=1,
                               rounds=3 if shape == "smollm2_output" else 15)
    finally:
        assert blas._choose(chosen) == blas.BLAS_NAMES[chosen]
    np.testing.assert_allclose(out, x.astype(np.float64) @ y.astype(np.float64),
                               rtol=1e-3, atol=1e-3 * np.sqrt(x.shape[1]))
    ratio_to(impl, openblas=None)
