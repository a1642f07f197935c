"""Copy compilers and acc (kernels: ``_kernels/_copy.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._copy as _copy
import ggopt._kernels._elementwise as ew

from ....ops._base import params_of
from ....ops.views import AccParams, ConcatParams
from ....tensor import Op, Tensor
from ....types import BF16
from ...base import Placement, Step
from . import lowp, quant
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.ACC)
def _acc(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    p = params_of(node, AccParams)
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    bt = srcs[1]
    buf, off = mem.at(node)
    part = np.ndarray((bt.ne[3], bt.ne[2], bt.ne[1], bt.ne[0]), dtype=np.float32,
                      buffer=buf.data, offset=off + p.offset, strides=(p.nb3, p.nb2, p.nb1, 4))
    same = np.shares_memory(a, d) and a.__array_interface__ == d.__array_interface__

    def step() -> None:
        if not same:
            np.copyto(d, a)
        if b.size:
            ew.binary(ew.BIN_ADD, part, b, part, be.n_threads)

    return step


@COMPILERS.register(Op.CPY, Op.DUP, Op.CONT)
def _copy_node(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if srcs[0].type is not node.type and (srcs[0].type.is_quantized or node.type.is_quantized):
        return quant.convert_step(be, node, srcs, mem)
    if srcs[0].type is not node.type and BF16 in (srcs[0].type, node.type):
        return lowp.convert_step(be, node, srcs, mem)
    a, d = mem(srcs[0]), mem(node)
    if a.shape == d.shape and a.dtype == d.dtype:
        return lambda: _copy.copy(a, d, be.n_threads)
    if a.shape == d.shape:
        return lambda: np.copyto(d, a, casting="unsafe")
    return lambda: np.copyto(d, a.reshape(d.shape), casting="unsafe")


@COMPILERS.register(Op.CONCAT)
def _concat(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    axis = 3 - params_of(node, ConcatParams).dim
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    na = a.shape[axis]
    da = d[(slice(None),) * axis + (slice(0, na),)]
    db = d[(slice(None),) * axis + (slice(na, None),)]

    def step() -> None:
        _copy.copy(a, da, be.n_threads)
        _copy.copy(b, db, be.n_threads)

    return step
