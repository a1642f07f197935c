"""Copy and acc array compilers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....ops._base import params_of
from ....ops.views import AccParams, ConcatParams
from ....tensor import Op, Tensor
from ....types import BF16
from ...base import Placement, Step
from ._base import COMPILERS, Srcs
from .lowp import converted
from .quant import dequantized, quantized

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.ACC)
def _acc(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp = be.xp
    p = params_of(node, AccParams)
    at, bt = srcs
    a, b, d = mem(at), mem(bt), mem(node)
    buf, off = mem.at(node)
    part = be.view_bytes(buf, off + p.offset, b.shape, (p.nb3, p.nb2, p.nb1, 4), d.dtype)
    a_buf, a_off = mem.at(at)
    same = a_buf is buf and a_off == off and at.nb == node.nb

    def step() -> None:
        if not same:
            d[...] = a
        xp.add(part, b, out=part)

    return step


@COMPILERS.register(Op.CPY, Op.DUP, Op.CONT)
def _copy(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    at = srcs[0]
    if at.type is not node.type and (at.type.is_quantized or node.type.is_quantized):
        def convert() -> None:
            d[...] = dequantized(be, at, a) if at.type.is_quantized else quantized(be, node, a)

        return convert
    if at.type is not node.type and BF16 in (at.type, node.type):  # raw bits <-> F32
        def convert_bf16() -> None:
            d[...] = converted(be, at.type, node.type, a).reshape(d.shape)

        return convert_bf16
    if a.shape == d.shape:
        def step() -> None:
            d[...] = a
    else:
        def step() -> None:
            d[...] = a.reshape(d.shape)  # ggml order: ne0 fastest, i.e. C order here
    return step


@COMPILERS.register(Op.CONCAT)
def _concat(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    axis = 3 - params_of(node, ConcatParams).dim
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    na = a.shape[axis]
    da = d[(slice(None),) * axis + (slice(0, na),)]
    db = d[(slice(None),) * axis + (slice(na, None),)]

    def step() -> None:
        da[...] = a
        db[...] = b

    return step
