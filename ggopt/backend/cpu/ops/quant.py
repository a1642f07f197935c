"""Compilers for nodes with a quantized source (kernels: ``_kernels/_quant.pyx`` and
``_quant_dot.pyx``): mul_mat (ggml's integer product) and out_prod of a quantized weight,
get_rows of quantized embeddings, and cpy between a quantized type and F32. The family
compilers (``linalg``, ``rows``, ``views``) hand such nodes here.

Products loop over ggml's dim-2/3 broadcast in Python; each 2-D product is one kernel call on
``n_threads`` OpenMP threads, its panels cut from the shapes alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._quant as _quant
import ggopt._kernels._quant_dot as _quant_dot

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ..blas import products_blas
from ._base import Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _rows_unit(a: np.ndarray) -> np.ndarray:
    """``a`` (2-D float32), with a unit stride along its rows (a copy when it has none)."""
    if a.shape[1] <= 1 or a.strides[1] == a.itemsize:
        return a
    return np.ascontiguousarray(a)


def product_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """MUL_MAT of a quantized ``A`` as ggml computes it (``B`` rounded to ``A``'s
    vec_dot_type, integer block sums: ``_quant_dot.mul_mat_q8``), or OUT_PROD (``R = B.T @
    deq(A)``, float32; the gradient through a frozen weight), NumPy order per 2-D slice."""
    products_blas()  # the sgemm the F32 products call (held at one thread while computing)
    a, b, c = mem(srcs[0]), mem(srcs[1]), mem(node)
    qtype = int(srcs[0].type)
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    slices = [(a[i3 // r3, i2 // r2], b[i3, i2], c[i3, i2])
              for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]
    kernel = _quant_dot.mul_mat_q8 if node.op is Op.MUL_MAT else _quant.out_prod_quantized
    mul_mat = node.op is Op.MUL_MAT

    def step() -> None:
        for w, x, out in slices:  # out_prod's B (M, N) is the transposed gradient: use B.T
            kernel(w, qtype, _rows_unit(x if mul_mat else x.T), out, be.n_threads)

    return step


def get_rows_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, idx, d = mem(srcs[0]), mem(srcs[1])[0], mem(node)
    qtype = int(srcs[0].type)
    return lambda: _quant.get_quantized_rows(a, qtype, np.ascontiguousarray(idx), d, be.n_threads)


def convert_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """CPY between a quantized type and F32 (same shape; the F32 side contiguous)."""
    a, d = mem(srcs[0]), mem(node)
    if srcs[0].type.is_quantized:
        qtype = int(srcs[0].type)
        return lambda: _quant.dequantize_rows(a, qtype, d, be.n_threads)
    qtype = int(node.type)
    return lambda: _quant.quantize_rows(a, qtype, d, be.n_threads)
