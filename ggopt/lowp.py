"""BF16 and F16 values as NumPy arrays, rounded exactly as ggml's CPU backend rounds them.

A BF16 array is its raw bits (``uint16``, the upper half of a float32). ggml converts F32 to
BF16 with ``ggml_compute_fp32_to_bf16``: a NaN keeps its sign and upper payload bits and is made
quiet (bit 6 set); every other value, subnormals included (this ggml no longer flushes them),
is rounded to nearest, ties to even. F16 is NumPy's ``float16`` (IEEE round to nearest even, as
ggml's F16C conversion). These are the references the kernels (``_kernels/_lowp.pyx``) and
the array backend are checked against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import DTypeError
from .types import GGType

__all__ = ["bf16_from_f32", "f32_from_bf16", "round_to", "widen"]


def bf16_from_f32(x: npt.ArrayLike, xp: Any = np) -> Any:
    """The BF16 bits (``uint16``) of float32 ``x``: round to nearest even, NaN made quiet.
    ``xp`` is the array module (NumPy, or CuPy for the array backend)."""
    u = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32)).view(xp.uint32)
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1)))) >> 16
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, (u >> 16) | xp.uint32(64), rounded).astype(xp.uint16)


def f32_from_bf16(bits: npt.ArrayLike, xp: Any = np) -> Any:
    """The float32 values of BF16 ``bits`` (``uint16``): exact."""
    b = xp.asarray(bits)
    if b.dtype != xp.uint16:
        raise DTypeError(f"f32_from_bf16: expected the raw bits as uint16, got {b.dtype}")
    return xp.ascontiguousarray(b.astype(xp.uint32) << 16).view(xp.float32)


def round_to(t: GGType, x: npt.ArrayLike, xp: Any = np) -> Any:
    """float32 ``x`` rounded to the low-precision type ``t`` (F16 or BF16) and back: the
    values ggml's products see after converting an activation to the weight's type."""
    a = xp.asarray(x, dtype=xp.float32)
    if t is GGType.BF16:
        return f32_from_bf16(bf16_from_f32(a, xp), xp)
    if t is GGType.F16:
        with np.errstate(over="ignore"):
            return a.astype(xp.float16).astype(xp.float32)
    raise DTypeError(f"round_to: {t!r} is not a low-precision float type; expected F16 or BF16")


def widen(t: GGType, raw: npt.ArrayLike, xp: Any = np) -> Any:
    """The float32 values of a BF16 (raw ``uint16`` bits) or F16 array."""
    if t is GGType.BF16:
        return f32_from_bf16(raw, xp)
    if t is GGType.F16:
        return xp.asarray(raw).astype(xp.float32)
    raise DTypeError(f"widen: {t!r} is not a low-precision float type; expected F16 or BF16")
