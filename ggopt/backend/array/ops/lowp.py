"""The reference for BF16 and F16 sources (``ggopt.lowp``'s rounding, in ``xp``): a weight
widened to float32, the other operand rounded to the weight's type, then the F32 array code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ....lowp import bf16_from_f32, round_to, widen
from ....types import BF16, GGType

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def widened(be: ArrayBackend, t: GGType, raw: Any) -> Any:
    """The float32 values of the F16 or BF16 (raw bits) array ``raw``."""
    return widen(t, raw, be.xp)


def rounded(be: ArrayBackend, t: GGType, values: Any) -> Any:
    """float32 ``values`` rounded to ``t`` (F16 or BF16), as float32."""
    return round_to(t, values, be.xp)


def converted(be: ArrayBackend, src: GGType, dst: GGType, a: Any) -> Any:
    """``a`` of type ``src`` as type ``dst`` (one of them BF16, the other F32)."""
    if src is BF16:
        return widen(BF16, a, be.xp)
    return bf16_from_f32(a, be.xp)
