"""Matrix products: mul_mat and out_prod (BLAS on the CPU; no parameters).

Compilers: ``backend/*_ops/linalg.py``.
"""

from __future__ import annotations

from ..context import Context
from ..errors import DTypeError, ShapeError
from ..tensor import Op, Tensor
from ..types import BF16, F32
from ._base import GradSink, backward, check_ctx, check_f32, ne_str
from .reduce import repeat_back
from .views import cont, cpy, reshape_4d, transpose, view_4d

__all__ = ["mul_mat", "out_prod"]


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a=[K, M, A2, A3]`` times ``b=[K, N, B2, B3]`` gives ``[M, N, B2, B3]`` (ggml_mul_mat).

    In NumPy terms ``C = B @ A.T``; ``a`` is broadcast over dims 2 and 3. ``a`` may be
    quantized (a weight; never trained): the gradient still flows to ``b``. With a BF16 or F16
    ``a``, ``b`` is rounded to ``a``'s type and the sums are F32 (ggml's ``vec_dot_type``).
    """
    check_ctx("mul_mat", ctx)
    _check_weight("mul_mat", a)
    check_f32("mul_mat", b=b)
    if a.ne[0] != b.ne[0]:
        raise ShapeError(f"ggml_mul_mat: a.ne[0]={a.ne[0]} must equal b.ne[0]={b.ne[0]} "
                         f"(a {ne_str(a)}, b {ne_str(b)})")
    if a.ne[2] == 0 or a.ne[3] == 0 or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ShapeError(f"ggml_mul_mat: a {ne_str(a)} cannot be broadcast over b {ne_str(b)} "
                         "in dims 2 and 3")
    if a.is_transposed():
        if a.ne[0] == 0:  # contiguous with ne0 = 0: nb[1] = 0 < nb[0], which ggml also refuses
            raise ShapeError(f"ggml_mul_mat: a {ne_str(a)} has ne[0] = 0; ggml refuses an "
                             "empty reduction (it reads as transposed: nb[1] < nb[0])")
        raise ShapeError("ggml_mul_mat: a must not be transposed (use cont first)")
    return ctx.new_op(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), Op.MUL_MAT, (a, b))


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a=[n0, K]`` and ``b=[n1, K]`` give ``[n0, n1]``: ``B.T @ A`` in NumPy terms.

    ggml: ``ggml_out_prod``.
    """
    check_ctx("out_prod", ctx)
    _check_weight("out_prod", a)
    check_f32("out_prod", b=b)
    if a.ne[1] != b.ne[1]:
        raise ShapeError(f"ggml_out_prod: a.ne[1]={a.ne[1]} must equal b.ne[1]={b.ne[1]}")
    if a.ne[2] == 0 or a.ne[3] == 0 or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ShapeError(f"ggml_out_prod: a {ne_str(a)} cannot be broadcast over b {ne_str(b)} "
                         "in dims 2 and 3")
    return ctx.new_op(F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]), Op.OUT_PROD, (a, b))


def _check_weight(fn: str, a: Tensor) -> None:
    """``a`` is F32, F16 or BF16 with contiguous rows, or quantized with whole rows of blocks
    (ggml's low-precision src0: the ``vec_dot`` / ``dequantize_row`` of its type)."""
    if type(a) is Tensor and a.type.is_lowp:
        if a.nb[0] != a.type.size:
            raise ShapeError(f"ggml_{fn}: {a.type.name} a '{a.name}' must have contiguous rows "
                             f"(nb={list(a.nb)})")
        return
    if type(a) is Tensor and a.type.is_quantized:
        if a.nb[0] != a.type.size or a.nb[1] < a.nb[0] * (a.ne[0] // a.type.blck_size):
            raise ShapeError(f"ggml_{fn}: quantized a '{a.name}' must have whole rows of "
                             f"blocks (nb={list(a.nb)})")
        return
    check_f32(fn, a=a)


def _sum_blocks(ctx: Context, t: Tensor, a: Tensor) -> Tensor:
    """``t=[K, M, B2, B3]`` summed over the blocks that mul_mat's broadcast of ``a=[K, M, A2, A3]``
    maps to one slice of ``a`` (slice ``i`` of ``a`` serves slices ``i*r .. i*r + r-1``)."""
    K, M, B2, B3 = t.ne
    A2, A3 = a.ne[2], a.ne[3]
    r2, r3 = B2 // A2, B3 // A3
    if r2 > 1:  # rows of K*M floats: [K*M, r2, A2, B3] with the block index j in dim 1
        v = view_4d(ctx, t, K * M, r2, A2, B3, t.nb[2], t.nb[2] * r2, t.nb[3], 0)
        t = reshape_4d(ctx, repeat_back(ctx, v, ctx.new_tensor(F32, (K * M, 1, A2, B3))),
                       K, M, A2, B3)
    if r3 > 1:
        v = view_4d(ctx, t, K * M * A2, r3, 1, A3, t.nb[3], t.nb[3], t.nb[3] * r3, 0)
        t = reshape_4d(ctx, repeat_back(ctx, v, ctx.new_tensor(F32, (K * M * A2, 1, 1, A3))),
                       K, M, A2, A3)
    return t


@backward(Op.MUL_MAT)
def _mul_mat_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        # A BF16 weight's own gradient (a BF16 copy of an F32 master: compute type bf16) is a
        # BF16 product too, as autocast's: x rounded to BF16, out_prod rounds g, F32 sums.
        xb = cpy(ctx, b, ctx.new_tensor(BF16, b.ne)) if a.type is BF16 else b
        sink.add(0, _sum_blocks(ctx, out_prod(ctx, xb, g), a))
    if sink.needs(1):  # a quantized a: out_prod dequantizes panels; BF16/F16: rounds g
        sink.add(1, out_prod(ctx, a, transpose(ctx, g)))


@backward(Op.OUT_PROD)
def _out_prod_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    # NumPy terms per slice: R = B^T A, so dA = B G (summed over the slices that share a slice
    # of a) and dB = A G^T, i.e. (G A^T)^T = mul_mat(a, g) transposed when a is broadcast.
    a, b = node.src
    if sink.needs(0):
        sink.add(0, _sum_blocks(ctx, mul_mat(ctx, cont(ctx, transpose(ctx, g)), b), a))
    if sink.needs(1):
        if a.type.is_quantized or a.type.is_lowp:
            kind = "quantized" if a.type.is_quantized else a.type.name
            raise DTypeError(f"ggml_out_prod: the gradient through a {kind} a '{a.name}' to b "
                             f"needs mul_mat(g, a) with a {kind} src1, which ggml lacks")
        if a.ne[2:] == b.ne[2:]:
            sink.add(1, mul_mat(ctx, g, a))
        else:
            sink.add(1, cont(ctx, transpose(ctx, mul_mat(ctx, a, g))))
