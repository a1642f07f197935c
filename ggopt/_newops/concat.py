"""concat: two tensors joined along one dimension (ggml_concat), with its backward.

The CPU backend runs it as two strided copies (:mod:`ggopt._kernels._copy`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ops as _ops
from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32
from ._base import GradSink, as_int, backward, check_ctx, check_f32, ne_str, params_of

__all__ = ["ConcatParams", "concat"]


@dataclass(frozen=True, slots=True)
class ConcatParams:
    """``Op.CONCAT``: the dimension (ggml order, 0..3) along which ``b`` follows ``a``."""

    dim: int


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """``a`` followed by ``b`` along dimension ``dim`` (ggml_concat; ``torch.cat`` along
    NumPy axis ``3 - dim`` of the 4-D view). The other dimensions must be equal."""
    check_ctx("concat", ctx)
    check_f32("concat", a=a, b=b)
    dim = as_int("concat", "dim", dim)
    if not 0 <= dim <= 3:
        raise ShapeError(f"ggml_concat: dim must be 0..3, got {dim}")
    if any(a.ne[i] != b.ne[i] for i in range(4) if i != dim):
        raise ShapeError(f"ggml_concat: a {ne_str(a)} and b {ne_str(b)} must agree in every "
                         f"dimension but {dim}")
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return ctx.new_op(F32, tuple(ne), Op.CONCAT, (a, b), ConcatParams(dim))


def _part(ctx: Context, g: Tensor, like: Tensor, dim: int, start: int) -> Tensor:
    """The block of ``g`` with ``like``'s shape at index ``start`` of ``dim``, contiguous."""
    v = _ops.view_4d(ctx, g, *like.ne, g.nb[1], g.nb[2], g.nb[3], start * g.nb[dim])
    return _ops.cont(ctx, v)


@backward(Op.CONCAT)
def _concat_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    dim = params_of(node, ConcatParams).dim
    if sink.needs(0):
        sink.add(0, _part(ctx, g, a, dim, 0))
    if sink.needs(1):
        sink.add(1, _part(ctx, g, b, dim, a.ne[dim]))
