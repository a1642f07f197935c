"""Fused optimizer steps: one pass over the parameter, its gradient and the moments, reading
the step parameters on the device."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import FUSED_COMPILERS, preamble

if TYPE_CHECKING:
    from ...array.backend import ArrayBackend

# ggml-opt-spec §2.10; p = [alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)];
# the update of one element is scalar_math.h's, as on the CPU
_ADAMW_SRC = (
    "w = ggopt_adamw1(w, g, &m, &v, p[0], p[1], p[2], p[3], 1.0f - p[0] * p[4], p[5], p[6])"
)

_SGD_SRC = "w = ggopt_sgd1(w, g, p[0], 1.0f - p[0] * p[1])"  # p = [alpha, wd]


@functools.cache
def _kernels(cupy: ModuleType) -> tuple[Any, Any]:
    """(AdamW, SGD) kernels, built once per process."""
    ek = cupy.ElementwiseKernel
    return (ek("float32 g, raw float32 p", "float32 w, float32 m, float32 v", _ADAMW_SRC,
               "ggopt_adamw", preamble=preamble()),
            ek("float32 g, raw float32 p", "float32 w", _SGD_SRC, "ggopt_sgd",
               preamble=preamble()))


@FUSED_COMPILERS.register(Op.OPT_STEP_ADAMW)
def _adamw(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    adamw = _kernels(be.xp)[0]
    w, g, m, v, p = (mem(s) for s in srcs)
    return lambda: adamw(g, p.reshape(-1), w, m, v)


@FUSED_COMPILERS.register(Op.OPT_STEP_SGD)
def _sgd(be: ArrayBackend, node: Tensor, srcs: tuple[Tensor, ...], mem: Placement) -> Step:
    sgd = _kernels(be.xp)[1]
    w, g, p = (mem(s) for s in srcs)
    return lambda: sgd(g, p.reshape(-1), w)
