"""Element-wise compilers (kernels: ``_kernels/_elementwise.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._elementwise as ew

from ....ops._base import params_of
from ....ops.elementwise import ScaleParams
from ....tensor import Op, Tensor, UnaryOp
from ...base import Placement, Step
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


_BINARY = {Op.ADD: ew.BIN_ADD, Op.SUB: ew.BIN_SUB, Op.MUL: ew.BIN_MUL, Op.DIV: ew.BIN_DIV}
_UNARY = {
    UnaryOp.NEG: ew.UN_NEG, UnaryOp.EXP: ew.UN_EXP, UnaryOp.RELU: ew.UN_RELU,
    UnaryOp.GELU: ew.UN_GELU, UnaryOp.SILU: ew.UN_SILU, UnaryOp.TANH: ew.UN_TANH,
    UnaryOp.SIGMOID: ew.UN_SIGMOID, UnaryOp.STEP: ew.UN_STEP, UnaryOp.ABS: ew.UN_ABS,
}
_SIMPLE = {Op.SQR: ew.UN_SQR, Op.SQRT: ew.UN_SQRT, Op.LOG: ew.UN_LOG}


@COMPILERS.register(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    op = _BINARY[node.op]
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: ew.binary(op, a, b, d, be.n_threads)


@COMPILERS.register(Op.SCALE)
def _scale(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    p = params_of(node, ScaleParams)
    a, d = mem(srcs[0]), mem(node)
    return lambda: ew.scale(a, d, p.s, p.bias, be.n_threads)


@COMPILERS.register(Op.SQR, Op.SQRT, Op.LOG, Op.UNARY)
def _unary(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    uop = _UNARY[params_of(node, UnaryOp)] if node.op is Op.UNARY else _SIMPLE[node.op]
    a, d = mem(srcs[0]), mem(node)
    return lambda: ew.unary(uop, a, d, be.n_threads)


@COMPILERS.register(Op.UNARY_BACK)
def _unary_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    uop = _UNARY[params_of(node, UnaryOp)]
    x, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: ew.unary_back(uop, x, g, d, be.n_threads)
