"""Convolution and pooling compilers (kernels: ``_kernels/_conv.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._conv as _conv

from ...ops._base import params_of
from ...ops.conv import Im2ColParams, PoolParams
from ...tensor import Op, Tensor
from ..base import Placement, Step
from . import conv_sparse
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..cpu import CPUBackend


@COMPILERS.register(Op.IM2COL)
def _im2col(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    k, x, d = srcs[0], mem(srcs[1]), mem(node)
    KW, KH = k.ne[0], k.ne[1]
    p = params_of(node, Im2ColParams)
    prm = (p.s0, p.s1, p.p0, p.p1, p.d0, p.d1)

    def step() -> None:
        n = be.n_threads
        scratch = conv_sparse.im2col_scratch(x.shape, d.shape, KH, KW, prm, n, False)
        if conv_sparse.prefer_sparse(scratch, x.size, d.size):
            conv_sparse.im2col_gather(x, d, KH, KW, prm)
        else:
            _conv.im2col(x, d, KH, KW, *prm, n)

    return step


@COMPILERS.register(Op.IM2COL_BACK)
def _im2col_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, k, d = mem(srcs[0]), srcs[1], mem(node)
    KW, KH = k.ne[0], k.ne[1]
    p = params_of(node, Im2ColParams)
    prm = (p.s0, p.s1, p.p0, p.p1, p.d0, p.d1)

    def step() -> None:
        n = be.n_threads
        scratch = conv_sparse.im2col_scratch(d.shape, g.shape, KH, KW, prm, n, True)
        if conv_sparse.prefer_sparse(scratch, g.size, d.size):
            conv_sparse.im2col_back_scatter(g, d, KH, KW, prm)
        else:
            _conv.im2col_back(g, d, KH, KW, *prm, n)

    return step


@COMPILERS.register(Op.POOL_2D)
def _pool(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    p = params_of(node, PoolParams)
    return lambda: _conv.pool_2d(a, d, p.op, p.k0, p.k1, p.s0, p.s1, p.p0, p.p1, be.n_threads)


@COMPILERS.register(Op.POOL_2D_BACK)
def _pool_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    p = params_of(node, PoolParams)
    return lambda: _conv.pool_2d_back(g, x, d, p.op, p.k0, p.k1, p.s0, p.s1, p.p0, p.p1,
                                      be.n_threads)
