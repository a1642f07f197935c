"""Convolution and pooling compilers (kernels: ``_kernels/_conv.pyx`` for im2col,
``_kernels/_pool.pyx``, the direct convolution ``_kernels/_conv2d.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ggopt._kernels._conv as _conv
import ggopt._kernels._conv2d as _conv2d
import ggopt._kernels._pool as _pooling

from ....ops._base import params_of
from ....ops.conv import Conv2DParams, Im2ColParams, PoolParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from . import conv_sparse
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _im2col_step(be: CPUBackend, node: Tensor, kernel: Tensor, image: Any, cols: Any,
                 back: bool) -> Step:
    """im2col (``cols`` from ``image``) or, with ``back``, its adjoint (``image`` from
    ``cols``): the OpenMP kernel, or the gather/scatter of ``conv_sparse`` when the kernel's
    padded scratch would dwarf the data."""
    KW, KH = kernel.ne[0], kernel.ne[1]
    p = params_of(node, Im2ColParams)
    prm = (p.s0, p.s1, p.p0, p.p1, p.d0, p.d1)
    src, dst = (cols, image) if back else (image, cols)
    sparse = conv_sparse.im2col_back_scatter if back else conv_sparse.im2col_gather
    dense = _conv.im2col_back if back else _conv.im2col

    def step() -> None:
        n = be.n_threads
        scratch = conv_sparse.im2col_scratch(image.shape, cols.shape, KH, KW, prm, n, back)
        if conv_sparse.prefer_sparse(scratch, src.size, dst.size):
            sparse(src, dst, KH, KW, prm)
        else:
            dense(src, dst, KH, KW, *prm, n)

    return step


@COMPILERS.register(Op.IM2COL)
def _im2col(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    return _im2col_step(be, node, srcs[0], mem(srcs[1]), mem(node), back=False)


@COMPILERS.register(Op.IM2COL_BACK)
def _im2col_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    return _im2col_step(be, node, srcs[1], mem(node), mem(srcs[0]), back=True)


def _conv_params(node: Tensor) -> tuple[int, int, int, int, int, int]:
    p = params_of(node, Conv2DParams)
    return p.s0, p.s1, p.p0, p.p1, p.d0, p.d1


@COMPILERS.register(Op.CONV_2D)
def _conv_2d(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    k, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    prm = _conv_params(node)
    return lambda: _conv2d.conv_2d(k, x, d, *prm, be.n_threads)


@COMPILERS.register(Op.CONV_2D_BACK_INPUT)
def _conv_2d_back_input(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    k, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    prm = _conv_params(node)
    return lambda: _conv2d.conv_2d_back_input(k, g, d, *prm, be.n_threads)


@COMPILERS.register(Op.CONV_2D_BACK_KERNEL)
def _conv_2d_back_kernel(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    x, g, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    prm = _conv_params(node)
    return lambda: _conv2d.conv_2d_back_kernel(x, g, d, *prm, be.n_threads)


@COMPILERS.register(Op.POOL_2D)
def _pool(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a, d = mem(srcs[0]), mem(node)
    p = params_of(node, PoolParams)
    return lambda: _pooling.pool_2d(a, d, p.op, p.k0, p.k1, p.s0, p.s1, p.p0, p.p1, be.n_threads)


@COMPILERS.register(Op.POOL_2D_BACK)
def _pool_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    p = params_of(node, PoolParams)
    return lambda: _pooling.pool_2d_back(g, x, d, p.op, p.k0, p.k1, p.s0, p.s1, p.p0, p.p1,
                                      be.n_threads)
