"""Compilers for nodes with a BF16 or F16 source (kernels: ``_kernels/_lowp.pyx``): mul_mat and
out_prod of a low-precision weight (the other operand rounded to the weight's type, F32 sums),
get_rows of low-precision embeddings, and cpy between BF16 and F32. The family compilers
(``linalg``, ``rows``, ``views``) hand such nodes here.

Products loop over ggml's dim-2/3 broadcast in Python; each 2-D product is one kernel call on
``n_threads`` OpenMP threads (every output summed by one thread in a fixed order). On request
(:data:`PACKED`, off by default: it saves 1-6 % of a product and costs the weight's bytes twice
over), a BF16 weight that no node of the graph writes (a frozen base: LoRA, inference) is packed
once: its panels are kept beside the weight's memory and checked against a 64-bit hash of the
weight's bits before every use (repacked when the bits changed).
"""

from __future__ import annotations

import os
import weakref
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


class PackedPanels:
    """The packed panels of BF16 weights that do not change, one entry per 2-D weight slice
    and orientation (mul_mat's, out_prod's transposed), with the hash of the bits they were
    packed from. An entry lives as long as the weight's memory. ``enabled`` (default False)
    turns the cache on; off, each product packs its weight, as it always does for F16 and
    computed weights (the same bits either way)."""

    def __init__(self) -> None:
        self.enabled = False
        self._entries: dict[tuple[int, int, int, int, int, bool], tuple[int, np.ndarray]] = {}

    def nbytes(self) -> int:
        """The bytes the cached panels hold now."""
        return sum(p.nbytes for _, p in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()

    def get(self, w: np.ndarray, transposed: bool, n_threads: int) -> np.ndarray | None:
        """The panels of BF16 bits ``w`` (2-D), packed now or before from the same bits."""
        if not self.enabled:
            return None
        key = (w.__array_interface__["data"][0], *w.shape, *w.strides, transposed)
        h = _lowp.lowp_hash(w, n_threads)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == h:
            return hit[1]
        packed: np.ndarray = _lowp.lowp_pack(w, int(BF16), n_threads, transposed)
        if hit is None:
            root = w
            while isinstance(root.base, np.ndarray):
                root = root.base
            weakref.finalize(root, self._entries.pop, key, None)
        self._entries[key] = (h, packed)
        return packed


#: the packed panels of constant BF16 weights (see :class:`PackedPanels`); on with
#: ``GGOPT_LOWP_PACKED=1`` in the environment (read at import)
PACKED = PackedPanels()
PACKED.enabled = os.environ.get("GGOPT_LOWP_PACKED", "0").strip() == "1"


def _constant(t: Tensor) -> bool:
    """True when no node computes ``t``'s memory: a leaf, or views of one."""
    while t.op in (Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE):
        t = t.src[0]
    return t.op is Op.NONE


def product_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """MUL_MAT (``C = r(B) @ A.T``) or OUT_PROD (``R = r(B).T @ A``) of a BF16/F16 ``A``, ``r``
    rounding to ``A``'s type (NumPy order per 2-D slice); a constant BF16 ``A``'s panels come
    from :data:`PACKED`."""
    a, b, c = _bits(mem(srcs[0])), mem(srcs[1]), mem(node)
    wtype = int(srcs[0].type)
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    mul_mat = node.op is Op.MUL_MAT
    cached = srcs[0].type is BF16 and _constant(srcs[0]) and a.strides[-1] == 2
    # out_prod's B (K, n1) is the transposed gradient: its rows are B.T's
    slices = [(a[i3 // r3, i2 // r2], b[i3, i2] if mul_mat else b[i3, i2].T, c[i3, i2])
              for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]

    def step() -> None:
        for w, x, out in slices:
            packed = PACKED.get(w, not mul_mat, be.n_threads) if cached else None
            _lowp.lowp_gemm(w, wtype, x, out, be.n_threads, not mul_mat, packed)

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
    if a.flags.c_contiguous and d.flags.c_contiguous:  # the C conversion, multithreaded
        src, dst = a.reshape(-1), d.reshape(-1)
        if srcs[0].type is BF16:
            return lambda: _lowp.bf16_to_f32(src.view(np.uint16), dst, be.n_threads)
        return lambda: _lowp.f32_to_bf16(src, dst.view(np.uint16), be.n_threads)
    if srcs[0].type is BF16:
        return lambda: np.copyto(d, widen(BF16, a).reshape(d.shape))
    return lambda: np.copyto(d, bf16_from_f32(a).reshape(d.shape))
