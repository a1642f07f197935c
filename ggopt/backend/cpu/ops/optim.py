"""Optimizer-step compilers (kernels: ``_kernels/_optim.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import ggopt._kernels._optim as _optim

from ....errors import ShapeError
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


def _flat(t: Tensor, mem: Placement) -> np.ndarray:
    arr = mem(t)
    flat: np.ndarray = arr.reshape(-1)
    if not np.shares_memory(flat, arr):
        raise ShapeError(f"optimizer step: '{t.name}' must be contiguous")
    return flat


@COMPILERS.register(Op.OPT_STEP_ADAMW)
def _adamw(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    w, g, m, v, p = (_flat(s, mem) for s in srcs)
    return lambda: _optim.adamw_step(w, g, m, v, p, be.n_threads)


@COMPILERS.register(Op.OPT_STEP_SGD)
def _sgd(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    w, g, p = (_flat(s, mem) for s in srcs)
    return lambda: _optim.sgd_step(w, g, p, be.n_threads)
