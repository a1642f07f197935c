"""Compilers for nodes with a BF16 or F16 source (kernels: ``_kernels/_lowp.pyx``): mul_mat and
out_prod of a low-precision weight (the other operand rounded to the weight's type, F32 sums),
get_rows of low-precision embeddings, and cpy between BF16 and F32. The family compilers
(``linalg``, ``rows``, ``views``) hand such nodes here.

Products loop over ggml's dim-2/3 broadcast in Python; each 2-D product is one kernel call on
``n_threads`` OpenMP threads (every output summed by one thread in a fixed order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._lowp as _lowp

from ....lowp import bf16_from_f32, widen
from ....tensor import Op, Tensor
from ....types import BF16
from ...base import Placement, Step, check_row_indices
from ._base import Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _bits(a: np.ndarray) -> np.ndarray:
    """The raw 16-bit words of an F16 or BF16 array."""
    return a.view(np.uint16)


def product_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """MUL_MAT (``C = r(B) @ A.T``) or OUT_PROD (``R = r(B).T @ A``) of a BF16/F16 ``A``, ``r``
    rounding to ``A``'s type (NumPy order per 2-D slice)."""
    a, b, c = _bits(mem(srcs[0])), mem(srcs[1]), mem(node)
    wtype = int(srcs[0].type)
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    mul_mat = node.op is Op.MUL_MAT
    # out_prod's B (K, n1) is the transposed gradient: its rows are B.T's
    slices = [(a[i3 // r3, i2 // r2], b[i3, i2] if mul_mat else b[i3, i2].T, c[i3, i2])
              for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]

    def step() -> None:
        for w, x, out in slices:
            _lowp.lowp_gemm(w, wtype, x, out, be.n_threads, not mul_mat)

    return step


def get_rows_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, idx, d = mem(srcs[0]), mem(srcs[1])[0], mem(node)
    t = srcs[0].type

    def step() -> None:
        check_row_indices("get_rows", idx, a.shape[2])
        for i3 in range(d.shape[0]):
            for i2 in range(d.shape[1]):
                d[i3, i2] = widen(t, a[i3, i2][idx[i3, i2]])

    return step


def convert_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """CPY between BF16 and F32 (any shapes of equal size, in ggml's element order)."""
    a, d = mem(srcs[0]), mem(node)
    if srcs[0].type is BF16:
        return lambda: np.copyto(d, widen(BF16, a).reshape(d.shape))
    return lambda: np.copyto(d, bf16_from_f32(a).reshape(d.shape))
