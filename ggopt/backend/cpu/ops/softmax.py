"""Softmax and cross-entropy compilers (kernels: ``_kernels/_softmax.pyx``; a masked softmax
``_kernels/_attention.pyx``; the cross-entropy on class ids ``_kernels/_ce_ids.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._attention as _attn
import ggopt._kernels._ce_ids as _ce_ids
import ggopt._kernels._softmax as _softmax

from ....ops._base import params_of
from ....ops.order import in_ggml_order
from ....ops.softmax import CrossEntropyIdsParams, SoftMaxParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from . import ggml_order
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _rows(arr: np.ndarray) -> np.ndarray:
    """A 2-D (rows, ne0) view of a 4-D array, copying only when no view exists."""
    return arr.reshape(-1, arr.shape[-1])


@COMPILERS.register(Op.SOFT_MAX)
def _soft_max(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    if in_ggml_order(node):
        return ggml_order.soft_max_step(be, node, srcs, mem)
    p = params_of(node, SoftMaxParams)
    a, d = mem(srcs[0]), mem(node)
    if len(srcs) == 1:
        return lambda: _softmax.soft_max(a, d, p.scale, be.n_threads)
    m = mem(srcs[1])
    return lambda: _attn.soft_max_ext(a, m, d, p.scale, p.max_bias, be.n_threads)


@COMPILERS.register(Op.SOFT_MAX_BACK)
def _soft_max_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    s = params_of(node, SoftMaxParams).scale
    g, y, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: _softmax.soft_max_back(g, y, d, s, be.n_threads)


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS)
def _ce(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    a4, b4, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[0, 0, 0, 0] = _softmax.cross_entropy_loss(_rows(a4), _rows(b4), be.n_threads)

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_BACK)
def _ce_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    g, a4, b4 = (mem(s) for s in srcs)
    d = _rows(mem(node))

    def step() -> None:
        _softmax.cross_entropy_loss_back(float(g[0, 0, 0, 0]), _rows(a4), _rows(b4), d,
                                         be.n_threads)

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_IDS)
def _ce_ids_loss(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    ignore = params_of(node, CrossEntropyIdsParams).ignore_id
    a4, ids, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[0, 0, 0, 0] = _ce_ids.cross_entropy_loss_ids(_rows(a4), ids.reshape(-1), ignore,
                                                        be.n_threads)

    return step


@COMPILERS.register(Op.CROSS_ENTROPY_LOSS_IDS_BACK)
def _ce_ids_back(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    ignore = params_of(node, CrossEntropyIdsParams).ignore_id
    g, a4, ids = (mem(s) for s in srcs)
    d = _rows(mem(node))

    def step() -> None:
        _ce_ids.cross_entropy_loss_ids_back(float(g[0, 0, 0, 0]), _rows(a4), ids.reshape(-1),
                                            d, ignore, be.n_threads)

    return step
