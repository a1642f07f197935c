"""Compilers for nodes with a quantized source (kernels: ``_kernels/_quant.pyx`` and
``_quant_dot.pyx``): mul_mat (ggml's integer product) and out_prod of a quantized weight,
get_rows of quantized embeddings, and cpy between a quantized type and F32. The family
compilers (``linalg``, ``rows``, ``views``) hand such nodes here.

Products loop over ggml's dim-2/3 broadcast in Python; each 2-D product is one kernel call on
``n_threads`` OpenMP threads, its panels cut from the shapes alone. The decoded panels of a
weight in a read-only buffer (mapped from its file: it cannot change) are made at its first
product of fewer than :data:`PANEL_ROWS` activation rows and kept with that buffer
(:func:`weight_panels`); other weights, and wider products of a weight not yet kept, are
decoded per call (the same bits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

import ggopt._kernels._quant as _quant
import ggopt._kernels._quant_dot as _quant_dot

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ...buffer import Buffer
from ..blas import products_blas
from ._base import Srcs, unit_rows

if TYPE_CHECKING:
    from ..backend import CPUBackend


# The packed panels of read-only weights, per buffer (freed with it), keyed by the weight
# slice's address, shape, strides and type.
_PANELS: WeakKeyDictionary[Buffer, dict[tuple[int, tuple[int, ...], tuple[int, ...], int],
                                        np.ndarray]] = WeakKeyDictionary()


#: Products with fewer activation rows than this make and keep a read-only weight's panels
#: (generation's one-token products, where decoding the weight would dominate); wider
#: products (a fine-tune's or an evaluation's 256-512 tokens) decode per call unless the
#: panels are already kept: decoding is a few % of such a product, the panels 2.2x a Q4_1
#: weight's memory (docs/quantized-products.md, "Cached panels").
PANEL_ROWS = 16


def weight_panels(buf: Buffer, w: np.ndarray, qtype: int, cols: int, n_threads: int,
                  rows: int) -> np.ndarray | None:
    """The panels :func:`_quant_dot.mul_mat_q8` multiplies for the weight ``w`` (2-D raw rows
    of ``cols`` elements in ``buf``) in a product of ``rows`` activation rows: packed at the
    first call with fewer than :data:`PANEL_ROWS` rows and kept while ``buf`` lives; None
    (decode per call) unless ``buf`` is read-only (only memory that cannot change may keep
    its panels) or while a wider product meets a weight with no panels kept."""
    if not buf.read_only:
        return None
    key = (w.__array_interface__["data"][0], w.shape, w.strides, qtype)
    store = _PANELS.get(buf)
    panels = None if store is None else store.get(key)
    if panels is None and rows < PANEL_ROWS:
        store = _PANELS.setdefault(buf, {})
        panels = np.empty(_quant_dot.packed_shape(qtype, w.shape[0], cols), np.uint8)
        _quant_dot.pack_weight(w, qtype, panels, n_threads)
        store[key] = panels
    return panels


def panels_bytes() -> int:
    """Bytes of all the weight panels kept now (:func:`weight_panels`)."""
    return sum(p.nbytes for store in list(_PANELS.values()) for p in store.values())


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
    if node.op is not Op.MUL_MAT:
        def out_prod() -> None:
            for w, x, out in slices:  # B (M, N) is the transposed gradient: use B.T
                _quant.out_prod_quantized(w, qtype, unit_rows(x.T), out, be.n_threads)

        return out_prod
    buf, cols = mem.at(srcs[0])[0], srcs[0].ne[0]
    kept: list[np.ndarray | None] = [None] * len(slices)  # panels live as long as ``buf``

    def step() -> None:
        n_threads = be.n_threads
        for i, (w, x, out) in enumerate(slices):
            packed = kept[i]
            if packed is None:
                packed = kept[i] = weight_panels(buf, w, qtype, cols, n_threads, x.shape[0])
            _quant_dot.mul_mat_q8(w, qtype, unit_rows(x), out, n_threads, packed=packed)

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
