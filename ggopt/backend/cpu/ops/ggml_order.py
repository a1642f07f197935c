"""Steps of the ops set to ggml's float order (:func:`ggopt.set_ggml_order`; kernels:
``_kernels/_ggml_order.pyx``, the rope's in ``_kernels/_rope.pyx``): the op's own compiler
hands a flagged node here. The kernels take rows with a unit stride: the softmax and the F32
product one call per node, the others one per 2-D ``(i3, i2)`` slice."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._ggml_order as _go

from ....ops._base import params_of
from ....ops.norm import NormParams
from ....ops.order import MulMatParams
from ....ops.softmax import SoftMaxParams
from ....tensor import Tensor
from ...base import Placement, Step
from ._base import Srcs, unit_rows

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _slices(*arrays: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """The 2-D ``(i3, i2)`` slices of 4-D arrays of one shape."""
    n3, n2 = arrays[0].shape[:2]
    return [tuple(a[i3, i2] for a in arrays) for i3 in range(n3) for i2 in range(n2)]


def rms_norm_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    eps = params_of(node, NormParams).eps
    pairs = _slices(mem(srcs[0]), mem(node))

    def step() -> None:
        for x, d in pairs:
            _go.rms_norm_rows(unit_rows(x), d, eps, be.n_threads)

    return step


def soft_max_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """``softmax(a * scale + mask)``: the mask's first ``ne1`` rows, broadcast over dims 2 and 3
    as ggml broadcasts it."""
    p = params_of(node, SoftMaxParams)
    a, d = mem(srcs[0]), mem(node)
    m = mem(srcs[1]) if len(srcs) > 1 else None
    return lambda: _go.soft_max_rows(unit_rows(a), None if m is None else unit_rows(m), d,
                                     p.scale, be.n_threads, p.kv_padded)


def swiglu_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    triples = _slices(mem(srcs[0]), mem(srcs[1]), mem(node))

    def step() -> None:
        for x, g, d in triples:
            _go.swiglu_rows(unit_rows(x), unit_rows(g), d, be.n_threads)

    return step


def _contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: densely packed, skipping the dims of one element."""
    if t.ne[0] != 1 and t.nb[0] != t.type.size:
        return False
    nxt = t.type.size * t.ne[0]
    for i in range(1, 4):
        if t.ne[i] != 1:
            if t.nb[i] != nxt:
                return False
            nxt *= t.ne[i]
    return True


def mul_mat_step(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    """``C = B @ A.T`` per slice (A broadcast over dims 2, 3): an F32 ``A`` in tinyBLAS's or
    ``ggml_vec_dot_f32``'s order as ggml chooses (``B`` contiguous and ``K % 8 == 0``: tinyBLAS;
    ``kv_padded``: tinyBLAS over ``K`` padded with zeros), a quantized ``A`` as ggml's AVX2
    ``vec_dot``."""
    a, b, c = mem(srcs[0]), mem(srcs[1]), mem(node)
    if srcs[0].type.is_quantized:
        qtype = int(srcs[0].type)
        r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
        jobs = [(a[i3 // r3, i2 // r2], b[i3, i2], c[i3, i2])
                for i3 in range(b.shape[0]) for i2 in range(b.shape[1])]

        def quantized() -> None:
            for w, x, out in jobs:
                _go.mul_mat_quant(w, qtype, unit_rows(x), out, be.n_threads)

        return quantized
    padded = params_of(node, MulMatParams).kv_padded
    a_t, b_t = srcs[0], srcs[1]
    k = -(-a_t.ne[0] // 8) * 8 if padded else a_t.ne[0]  # llama.cpp's cache pads K (and b)
    tiny = _go.tiny_order(k, a_t.ne[1], b_t.ne[1], padded or _contiguous(b_t))
    return lambda: _go.mul_mat_f32(unit_rows(a), unit_rows(b), c, tiny, be.n_threads)
