"""Argument checks shared by the opt modules, the language-model loops and the command lines:
``check_int`` (an int, not a bool) and ``check_float32`` (a number checked as float32, in range)."""

from __future__ import annotations

import math
import numbers
from typing import cast

import numpy as np

from ..errors import DTypeError, InvalidValueError

__all__ = ["check_int", "check_float32"]

_F32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32, 1.18e-38
_F32_SAFE = 3.4e38  # below float32's largest value: converts without overflow


def _where(where: str) -> str:
    return f" ({where})" if where else ""


def _shown(value: object, wide: float) -> str:
    return f"{wide:g}" if math.isfinite(wide) or not isinstance(value, int) else "beyond 1e308"


def check_int(value: object, name: str, fn: str) -> int:
    """``value`` as an int; DTypeError for anything without ``__index__`` (bools included)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise DTypeError(f"{name} must be an int, got {value!r} ({fn})")
    return int(value.__index__())


def _bounds(low: float, high: float, low_open: bool, high_open: bool) -> str:
    parts = []
    if low > -math.inf:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high < math.inf:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts) or "a finite number"


def check_float32(value: object, name: str, where: str, *, low: float = -math.inf,
                  high: float = math.inf, low_open: bool = False,
                  high_open: bool = False) -> float:
    """``value`` as a float, after checking it as the float32 the kernels will compute with:
    a real number whose float32 is finite, not flushed to zero (zero, or at least 1.18e-38 in
    magnitude: computes flush subnormals) and within the bounds.

    Raises
    ------
    DTypeError
        ``value`` is not a real number (bools are not).
    InvalidValueError
        Not finite in float32 (NaN, inf, or beyond 3.4e38), nonzero but rounding to zero or
        to a subnormal float32, or outside ``[low, high]`` (open ends where asked).
        The message names ``name`` and ends with ``(where)`` unless ``where`` is empty.
    """
    kind = type(value)
    if kind is not float and kind is not int and (  # the usual types first: this runs per step
            isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise DTypeError(f"{name} must be a real number, got {value!r}{_where(where)}")
    try:
        wide = float(cast(float, value))  # a real number, checked above
    except OverflowError:  # an int beyond any float
        wide = -math.inf if str(value).startswith("-") else math.inf
    if abs(wide) <= _F32_SAFE:  # no float32 overflow: no NumPy error state needed (per step)
        f32 = float(np.float32(wide))
    else:
        with np.errstate(over="ignore"):
            f32 = float(np.float32(wide))
    if not math.isfinite(f32):
        raise InvalidValueError(f"{name} must be finite in float32 (the kernels' type: at most "
                                f"3.4e38) and {_bounds(low, high, low_open, high_open)}, got "
                                f"{_shown(value, wide)}{_where(where)}")
    if wide != 0 and abs(f32) < _F32_TINY:
        raise InvalidValueError(f"{name} must be {_bounds(low, high, low_open, high_open)}, got "
                                f"{_shown(value, wide)}, which is {f32:g} in float32 (the "
                                f"kernels' type): computes flush magnitudes below "
                                f"{_F32_TINY:.3g} to 0{_where(where)}")
    if f32 < low or (low_open and f32 == low) or f32 > high or (high_open and f32 == high):
        raise InvalidValueError(f"{name} must be {_bounds(low, high, low_open, high_open)}, got "
                                f"{_shown(value, wide)}{_where(where)}")
    return wide
