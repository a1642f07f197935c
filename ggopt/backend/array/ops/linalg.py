"""Matrix-product array compilers: ``xp.matmul`` over views that turn ggml's dim-2/3
broadcast into batch axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, Srcs, split_axes
from .lowp import rounded, widened
from .quant import dequantized, int_product

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def _batch_split(a_shape: Sequence[int], b_shape: Sequence[int]
                 ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Axis groups for ggml's dim-2/3 broadcast in mul_mat/out_prod: ``b[i3, i2]`` pairs with
    ``a[i3 // r3, i2 // r2]``, so ``b``'s batch axes split into ``(len_a, r)``."""
    ga: list[tuple[int, ...]] = []
    gb: list[tuple[int, ...]] = []
    for n_a, n_b in zip(a_shape[:2], b_shape[:2]):
        if n_a == n_b:
            ga.append((n_a,))
            gb.append((n_b,))
        else:
            ga.append((n_a, 1))
            gb.append((n_a, n_b // n_a))
    return ga, gb


def _whole(arr: Any) -> list[tuple[int, ...]]:
    return [(n,) for n in arr.shape]


@COMPILERS.register(Op.MUL_MAT)
def _mul_mat(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    # Per 2-D slice: C (N, M) = B (N, K) @ A (M, K).T; OUT_PROD: R (n1, n0) = B (K, n1).T @ A
    a, b, c = mem(srcs[0]), mem(srcs[1]), mem(node)
    if srcs[0].type.is_quantized and node.op is Op.MUL_MAT:
        return _int_products(be, int(srcs[0].type), a, b, c)
    if srcs[0].type.is_quantized:
        raw, qt = a, srcs[0]
        return lambda: _products(be, node, dequantized(be, qt, raw), b, c)()
    if srcs[0].type.is_lowp:  # ggml's vec_dot_type: b rounded to a's type, F32 products
        t = srcs[0].type
        return lambda: _products(be, node, widened(be, t, a), rounded(be, t, b), c)()
    return _products(be, node, a, b, c)


def _int_products(be: ArrayBackend, qtype: int, a: Any, b: Any, c: Any) -> Step:
    """MUL_MAT of the quantized rows ``a`` (raw blocks) with ``b`` into ``c``, per 2-D slice
    (ggml's dim-2/3 broadcast), as ggml's integer product."""
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]

    def step() -> None:
        raw, x = be.to_host(a), be.to_host(b)
        for i3 in range(b.shape[0]):
            for i2 in range(b.shape[1]):
                c[i3, i2] = be.xp.asarray(int_product(raw[i3 // r3, i2 // r2], qtype,
                                                      x[i3, i2]))

    return step


def _products(be: ArrayBackend, node: Tensor, a: Any, b: Any, c: Any) -> Step:
    """The MUL_MAT or OUT_PROD of the F32 arrays a, b into c."""
    xp = be.xp
    ga, gb = _batch_split(a.shape, b.shape)
    c = split_axes(xp, c, gb + _whole(c)[2:])
    if node.op is Op.MUL_MAT:
        at = xp.swapaxes(split_axes(xp, a, ga + _whole(a)[2:]), -1, -2)
        b = split_axes(xp, b, gb + _whole(b)[2:])
        return lambda: xp.matmul(b, at, out=c)
    a = split_axes(xp, a, ga + _whole(a)[2:])
    bt = xp.swapaxes(split_axes(xp, b, gb + _whole(b)[2:]), -1, -2)
    return lambda: xp.matmul(bt, a, out=c)


@COMPILERS.register(Op.OUT_PROD)
def _out_prod(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    # Per 2-D slice: R (n1, n0) = B (K, n1).T @ A (K, n0)
    return _mul_mat(be, node, srcs, mem)  # the same dispatch, by node.op
