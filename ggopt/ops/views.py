"""Views, reshapes, permutations and copies (no arithmetic), plus acc (add into a view).

Kernels: :mod:`ggopt._kernels._copy`; compilers: ``backend/*_ops/views.py``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass

from ..context import Context, normalize_ne
from ..errors import DTypeError, ShapeError
from ..tensor import Op, Tensor
from ..types import BF16, F32
from ._base import (
    GradSink,
    as_int,
    backward,
    check_ctx,
    check_f32,
    check_tensor,
    ignore_sources,
    ne_str,
    params_of,
)
from .elementwise import scale as _scale

__all__ = [
    "ViewParams", "PermuteParams", "AccParams", "view_1d", "view_2d", "view_3d", "view_4d",
    "reshape", "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d", "permute", "transpose",
    "cont", "dup", "cpy", "acc", "ConcatParams", "concat",
]


@dataclass(frozen=True, slots=True)
class ViewParams:
    """``Op.VIEW``: the byte offset of the view into its source."""

    offset: int


@dataclass(frozen=True, slots=True)
class PermuteParams:
    """``Op.PERMUTE``: source dimension ``i`` moves to position ``axes[i]``."""

    axes: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class AccParams:
    """``Op.ACC``: ``b`` is added into the view of ``a`` with byte strides ``nb1..nb3`` at byte
    ``offset`` (``nb0`` is 4: F32)."""

    nb1: int
    nb2: int
    nb3: int
    offset: int


def _check_strides(fn: str, nb: Sequence[int]) -> None:
    """Byte strides must be >= 0: with a negative one, a view that passes the end-of-data
    check would still reach memory before its start (another tensor's)."""
    for i, n in enumerate(nb):
        if n < 0:
            raise ShapeError(f"ggml_{fn}: byte stride nb{i} must be >= 0, got {n}")


def _view(fn: str, ctx: Context, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...] | None,
          offset: int) -> Tensor:
    check_ctx(fn, ctx)
    check_tensor(fn, "a", a)
    ne4 = normalize_ne(ne)
    offset = as_int(fn, "offset", offset)
    nb4: tuple[int, int, int, int] | None = None
    blck = a.type.blck_size
    if ne4[0] % blck:
        raise ShapeError(f"ggml_{fn}: a view of {a.type.name} tensor '{a.name}' must hold whole "
                         f"{blck}-element blocks per row, got ne0={ne4[0]}")
    if nb is None:
        nbl = [a.type.size, a.type.size * (ne4[0] // blck)]
        nbl += [nbl[1] * ne4[1], nbl[1] * ne4[1] * ne4[2]]
    else:
        nbl = [a.type.size] + [as_int(fn, f"nb{i + 1}", n) for i, n in enumerate(nb)]
        _check_strides(fn, nbl)
        last = nbl[-1]
        nbl += [last * ne4[i] for i in range(len(nbl), 4)]
        nb4 = (nbl[0], nbl[1], nbl[2], nbl[3])
    if a.type.is_quantized:
        _check_block_aligned(fn, a, (a.view_offs if a.view_src is not None else 0) + offset,
                             nbl[1:])
    size = 0 if 0 in ne4 else a.type.size * (ne4[0] // blck) + builtins.sum(
        (n - 1) * s for n, s in zip(ne4[1:], nbl[1:]))
    owner_bytes = a.data_owner().nbytes()
    start = (a.view_offs if a.view_src is not None else 0) + offset
    if offset < 0 or start + size > owner_bytes:
        raise ShapeError(f"ggml_{fn}: a view of {size} bytes at offset {offset} does not fit in "
                         f"the {owner_bytes} bytes of '{a.data_owner().name}'")
    return ctx.new_view(a, ne4, nb4, offset, Op.VIEW, (a,), ViewParams(offset))


def _check_block_aligned(fn: str, a: Tensor, start: int, strides: Sequence[int]) -> None:
    """A view of a quantized tensor starts at a block and steps by whole blocks: anything else
    would read the middle of a block as its scales."""
    bad = [f"offset {start}"] if start % a.type.size else []
    bad += [f"nb{i + 1} = {n}" for i, n in enumerate(strides) if n % a.type.size]
    if bad:
        raise ShapeError(f"ggml_{fn}: a view of {a.type.name} tensor '{a.name}' must start and "
                         f"step at whole {a.type.size}-byte blocks, got {', '.join(bad)}")


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """A 1-D view of ``a`` starting at byte ``offset`` (ggml_view_1d)."""
    return _view("view_1d", ctx, a, (ne0,), None, offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """A 2-D view with row stride ``nb1`` bytes (ggml_view_2d)."""
    return _view("view_2d", ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int) -> Tensor:
    """A 3-D view (ggml_view_3d)."""
    return _view("view_3d", ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int,
            nb3: int, offset: int) -> Tensor:
    """A 4-D view (ggml_view_4d)."""
    return _view("view_4d", ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


@backward(Op.VIEW)
def _view_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        if not a.is_contiguous():
            raise ShapeError("ggml_view: gradients of views of non-contiguous tensors are not "
                             "supported")
        base = _scale(ctx, a, 0.0)
        sink.add(0, acc(ctx, base, g, node.nb[1], node.nb[2], node.nb[3],
                           params_of(node, ViewParams).offset))


def _reshape(fn: str, ctx: Context, a: Tensor, ne: tuple[int, ...]) -> Tensor:
    check_ctx(fn, ctx)
    check_tensor(fn, "a", a)
    ne4 = normalize_ne(ne)
    if not a.is_contiguous():
        raise ShapeError(f"ggml_{fn}: a must be contiguous (use cont first)")
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    if ne4[0] % a.type.blck_size:
        raise ShapeError(f"ggml_{fn}: a {a.type.name} tensor ('{a.name}') reshaped must keep "
                         f"whole {a.type.blck_size}-element blocks per row, got ne0={ne4[0]}")
    if n != a.nelements():
        raise ShapeError(f"ggml_{fn}: cannot reshape {a.nelements()} elements {ne_str(a)} "
                         f"into {list(ne4)} ({n} elements)")
    return ctx.new_view(a, ne4, None, 0, Op.RESHAPE, (a,))


def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a`` with the shape of ``b`` (ggml_reshape)."""
    check_tensor("reshape", "b", b)
    return _reshape("reshape", ctx, a, b.ne)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape("reshape_1d", ctx, a, (ne0,))


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape("reshape_2d", ctx, a, (ne0, ne1))


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape("reshape_3d", ctx, a, (ne0, ne1, ne2))


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape("reshape_4d", ctx, a, (ne0, ne1, ne2, ne3))


@backward(Op.RESHAPE)
def _reshape_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, reshape(ctx, g if g.is_contiguous() else cont(ctx, g), node.src[0]))


def _check_not_quantized(fn: str, a: Tensor) -> None:
    if a.type.is_quantized:
        raise DTypeError(f"ggml_{fn}: tensor '{a.name}' is {a.type.name}: ggopt's quantized "
                         f"kernels read whole rows of blocks in place, so a quantized tensor is "
                         f"never {fn}d (dequantize it with cpy first)")


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Move source dimension ``i`` to position ``axis_i`` (ggml_permute)."""
    check_ctx("permute", ctx)
    check_tensor("permute", "a", a)
    _check_not_quantized("permute", a)
    given = [as_int("permute", f"axis{i}", x) for i, x in enumerate((axis0, axis1, axis2, axis3))]
    axes = (given[0], given[1], given[2], given[3])
    if sorted(axes) != [0, 1, 2, 3]:
        raise ShapeError(f"ggml_permute: axes must be a permutation of 0..3, got {list(axes)}")
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    return ctx.new_view(a, (ne[0], ne[1], ne[2], ne[3]), (nb[0], nb[1], nb[2], nb[3]), 0,
                        Op.PERMUTE, (a,), PermuteParams(axes))


def transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap dims 0 and 1 without copying (ggml_transpose)."""
    check_ctx("transpose", ctx)
    check_tensor("transpose", "a", a)
    _check_not_quantized("transpose", a)
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return ctx.new_view(a, ne, nb, 0, Op.TRANSPOSE, (a,))


@backward(Op.PERMUTE)
def _permute_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        axes = params_of(node, PermuteParams).axes
        inv = [0] * 4
        for i, ax in enumerate(axes):
            inv[ax] = i
        sink.add(0, permute(ctx, g, *inv))


@backward(Op.TRANSPOSE)
def _transpose_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, transpose(ctx, g))


def cont(ctx: Context, a: Tensor) -> Tensor:
    """A contiguous copy of ``a`` (ggml_cont)."""
    check_ctx("cont", ctx)
    check_tensor("cont", "a", a)
    return ctx.new_op(a.type, a.ne, Op.CONT, (a,))


def dup(ctx: Context, a: Tensor) -> Tensor:
    """A copy of ``a`` (ggml_dup)."""
    check_ctx("dup", ctx)
    check_tensor("dup", "a", a)
    return ctx.new_op(a.type, a.ne, Op.DUP, (a,))


def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy ``a`` into ``b`` converting the type; the result is a view of ``b`` (ggml_cpy)."""
    check_ctx("cpy", ctx)
    check_tensor("cpy", "a", a)
    check_tensor("cpy", "b", b)
    if a.nelements() != b.nelements():
        raise ShapeError(f"ggml_cpy: a has {a.nelements()} elements, b has {b.nelements()}")
    if (a.type.is_quantized or b.type.is_quantized) and a.type is not b.type:
        _check_conversion(a, b)
    if BF16 in (a.type, b.type) and a.type is not b.type and F32 not in (a.type, b.type):
        raise DTypeError(f"ggml_cpy: {a.type.name} -> {b.type.name}: BF16 converts to or from "
                         "F32 only")
    return ctx.new_view(b, b.ne, b.nb, 0, Op.CPY, (a, b))


def _check_conversion(a: Tensor, b: Tensor) -> None:
    """A cpy between a quantized type and F32 (ggml's dequantize / quantize): row for row,
    the quantized side with whole rows of blocks, the F32 side contiguous."""
    q, f = (a, b) if a.type.is_quantized else (b, a)
    if f.type is not F32 or (a.type.is_quantized and b.type.is_quantized):
        raise DTypeError(f"ggml_cpy: {a.type.name} -> {b.type.name}: a quantized tensor "
                         "converts to or from F32 only")
    if b.type.is_quantized and not b.type.can_quantize:
        raise DTypeError(f"ggml_cpy: F32 -> {b.type.name}: ggopt computes with {b.type.name} "
                         "but cannot quantize to it (no reference quantizer to match)")
    if a.ne != b.ne or not f.is_contiguous() or q.nb[0] != q.type.size:
        raise ShapeError(f"ggml_cpy: {a.type.name} -> {b.type.name} needs the same shape "
                         f"(a {ne_str(a)}, b {ne_str(b)}), a contiguous F32 side and whole "
                         "rows of blocks")


@backward(Op.CONT)
@backward(Op.DUP)
@backward(Op.CPY)
def _copy_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a = node.src[0]
        sink.add(0, g if g.ne == a.ne else reshape(ctx, cont(ctx, g), a))


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """A copy of ``a`` with ``b`` added into the view ``(b.ne, nb1, nb2, nb3, offset)``.

    ggml: ``ggml_acc``.
    """
    check_ctx("acc", ctx)
    check_f32("acc", a=a, b=b)
    if not a.is_contiguous():
        raise ShapeError("ggml_acc: a must be contiguous")
    nb = (4, as_int("acc", "nb1", nb1), as_int("acc", "nb2", nb2), as_int("acc", "nb3", nb3))
    _check_strides("acc", nb)
    offset = as_int("acc", "offset", offset)
    end = offset + 4 + builtins.sum((n - 1) * s for n, s in zip(b.ne, nb))
    if offset < 0 or (b.nelements() > 0 and end > a.nbytes()):
        raise ShapeError(f"ggml_acc: the view of b {ne_str(b)} at offset {offset} reaches byte "
                         f"{end}, beyond a's {a.nbytes()} bytes")
    return ctx.new_op(F32, a.ne, Op.ACC, (a, b), AccParams(nb[1], nb[2], nb[3], offset))


@backward(Op.ACC)
def _acc_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    p = params_of(node, AccParams)
    if sink.needs(0):
        sink.add(0, g)
    if sink.needs(1):
        part = view_4d(ctx, g, *b.ne, p.nb1, p.nb2, p.nb3, p.offset)
        sink.add(1, reshape(ctx, cont(ctx, part), b))


ignore_sources(Op.CPY, 1)


# --- concat -----------------------------------------------------------------------------


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
    return ctx.new_op(F32, (ne[0], ne[1], ne[2], ne[3]), Op.CONCAT, (a, b), ConcatParams(dim))


def _concat_part(ctx: Context, g: Tensor, like: Tensor, dim: int, start: int) -> Tensor:
    """The block of ``g`` with ``like``'s shape at index ``start`` of ``dim``, contiguous."""
    return cont(ctx, view_4d(ctx, g, *like.ne, g.nb[1], g.nb[2], g.nb[3], start * g.nb[dim]))


@backward(Op.CONCAT)
def _concat_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    dim = params_of(node, ConcatParams).dim
    if sink.needs(0):
        sink.add(0, _concat_part(ctx, g, a, dim, 0))
    if sink.needs(1):
        sink.add(1, _concat_part(ctx, g, b, dim, a.ne[dim]))
