"""swiglu, sin, cos and add1 array compilers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....ops._base import params_of
from ....ops.pointwise import GluParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.GLU)
def _glu_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    xp, d = be.xp, mem(node)
    if len(srcs) == 2:
        x, u = mem(srcs[0]), mem(srcs[1])
    else:
        a, n = mem(srcs[0]), node.ne[0]
        x, u = a[..., :n], a[..., n:]
        if params_of(node, GluParams).swapped:
            x, u = u, x

    def step() -> None:
        d[...] = (x * (F32(1) / (F32(1) + xp.exp(-x)))) * u

    return step


@COMPILERS.register(Op.SIN, Op.COS)
def _trig_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    fn = be.xp.sin if node.op is Op.SIN else be.xp.cos
    a, d = mem(srcs[0]), mem(node)
    return lambda: fn(a, out=d)


@COMPILERS.register(Op.ADD1)
def _add1_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    add = be.xp.add
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: add(a, b, out=d)
