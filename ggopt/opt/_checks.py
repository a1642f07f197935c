"""Argument checks shared by the opt modules (their messages end with the ggml function)."""

from __future__ import annotations

from ..errors import DTypeError

__all__ = ["check_int"]


def check_int(value: object, name: str, fn: str) -> int:
    """``value`` as an int; DTypeError for anything without ``__index__`` (bools included)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise DTypeError(f"{name} must be an int, got {value!r} ({fn})")
    return int(value.__index__())
