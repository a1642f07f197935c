"""Optimizer-step array compilers (ggml-opt-spec §2.10), in place into the parameter, m and v."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..backend import ArrayBackend


@COMPILERS.register(Op.OPT_STEP_ADAMW)
def _adamw(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    w, g, m, v, p4 = (mem(s) for s in srcs)

    def step() -> None:
        alpha, b1, b2, eps, wd, b1h, b2h = p4.reshape(-1)[:7]
        m[...] = m * b1 + g * (F32(1) - b1)
        v[...] = v * b2 + g * g * (F32(1) - b2)
        mh = m * b1h
        vh = be.xp.sqrt(v * b2h) + eps
        w[...] = w * (F32(1) - alpha * wd) - alpha * mh / vh

    return step


@COMPILERS.register(Op.OPT_STEP_SGD)
def _sgd(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    w, g, p4 = (mem(s) for s in srcs)

    def step() -> None:
        alpha, wd = p4.reshape(-1)[:2]
        w[...] = w * (F32(1) - alpha * wd) - alpha * g

    return step
