"""The registry of the CuPy backend's fused-kernel compilers (they replace the array code of
:mod:`ggopt.backend.array.ops` for the ops every training step runs) and the preamble of their
kernels."""

from __future__ import annotations

import functools
import pathlib

from ...._registry import Registry
from ....tensor import Op
from ...array.ops import Compiler

__all__ = ["FUSED_COMPILERS", "preamble"]

FUSED_COMPILERS: Registry[Op, Compiler] = Registry("CuPy fused compilers")

_HEADER = pathlib.Path(__file__).resolve().parents[3] / "_kernels" / "scalar_math.h"


@functools.cache
def preamble() -> str:
    """``_kernels/scalar_math.h`` as CUDA device code: the same scalar functions as the CPU
    kernels, over CUDA's ``expf``."""
    return ("#define GGOPT_FN __device__ __forceinline__\n#define GGOPT_EXP_FN expf\n"
            + _HEADER.read_text())
