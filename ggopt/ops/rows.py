"""Row gathers: get_rows (embeddings) and its scatter-add adjoint get_rows_back.

Kernels: :mod:`ggopt._kernels._get_rows`; compilers: ``backend/*_ops/rows.py``.
"""

from __future__ import annotations

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32, I32
from ._base import (
    GradSink,
    backward,
    check_ctx,
    check_f32,
    check_tensor,
    check_type,
    ignore_sources,
    ne_str,
)

__all__ = ["get_rows", "get_rows_back"]


def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` picked by the I32 indices ``b`` (ggml_get_rows; embeddings).

    ``a=[ne0, nrows, ne2, ne3]``, ``b=[n, ne2, ne3]`` gives ``[ne0, n, ne2, ne3]``.
    """
    check_ctx("get_rows", ctx)
    check_tensor("get_rows", "a", a)
    if a.type.is_lowp:  # F16/BF16 rows are converted to F32
        if a.nb[0] != a.type.size:
            raise ShapeError(f"ggml_get_rows: {a.type.name} a '{a.name}' must have contiguous "
                             "rows")
    elif not a.type.is_quantized:  # a quantized a: its rows are dequantized (the embeddings)
        check_f32("get_rows", a=a)
    elif a.nb[0] != a.type.size:
        raise ShapeError(f"ggml_get_rows: quantized a '{a.name}' must have whole rows of blocks")
    check_type("get_rows", "b", b, I32)
    if b.ne[3] != 1 or b.ne[1] != a.ne[2] or b.ne[2] != a.ne[3]:
        raise ShapeError(f"ggml_get_rows: indices {ne_str(b)} must be [n, a.ne2, a.ne3] for "
                         f"a {ne_str(a)}")
    return ctx.new_op(F32, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), Op.GET_ROWS, (a, b))


def get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Scatter-add of the rows ``a=[ne0, n]`` to indices ``b=[n]``, in the shape of ``c``.

    ggml: ``ggml_get_rows_back``.
    """
    check_ctx("get_rows_back", ctx)
    check_f32("get_rows_back", a=a)
    check_type("get_rows_back", "b", b, I32)
    check_tensor("get_rows_back", "c", c)
    if not a.is_matrix() or not b.is_vector() or not c.is_matrix() or \
            b.ne[0] != a.ne[1] or a.ne[0] != c.ne[0]:
        raise ShapeError(f"ggml_get_rows_back: expected a=[ne0, n], b=[n], c=[ne0, nrows], got "
                         f"a {ne_str(a)}, b {ne_str(b)}, c {ne_str(c)}")
    return ctx.new_op(F32, c.ne, Op.GET_ROWS_BACK, (a, b))


@backward(Op.GET_ROWS)
def _get_rows_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(0):
        if not a.is_matrix():
            raise ShapeError("ggml_get_rows: gradients are supported for 2-D sources only")
        sink.add(0, get_rows_back(ctx, g, b, a))


ignore_sources(Op.GET_ROWS, 1)
ignore_sources(Op.GET_ROWS_BACK, 1)
