"""Element types and tensor flags, with ggml's numeric values."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import DTypeError

__all__ = [
    "GGType", "TensorFlag", "F32", "F16", "I32", "I64", "type_size", "np_dtype", "GGML_MAX_DIMS",
    "FLAG_INPUT", "FLAG_OUTPUT", "FLAG_PARAM", "FLAG_LOSS", "FLAG_COMPUTE",
]

GGML_MAX_DIMS = 4


class GGType(enum.IntEnum):
    """Tensor element types (values are ggml's ``enum ggml_type``)."""

    F32 = 0
    F16 = 1
    I32 = 26
    I64 = 27

    @property
    def dtype(self) -> np.dtype[Any]:
        return _NP_DTYPES[self]

    @property
    def size(self) -> int:
        return int(_NP_DTYPES[self].itemsize)

    @property
    def is_float(self) -> bool:
        return self in (GGType.F32, GGType.F16)


F32 = GGType.F32
F16 = GGType.F16
I32 = GGType.I32
I64 = GGType.I64

_NP_DTYPES: dict[GGType, np.dtype[Any]] = {
    GGType.F32: np.dtype(np.float32),
    GGType.F16: np.dtype(np.float16),
    GGType.I32: np.dtype(np.int32),
    GGType.I64: np.dtype(np.int64),
}
_FROM_NP = {v: k for k, v in _NP_DTYPES.items()}


class TensorFlag(enum.IntFlag):
    """Tensor flags (values are ggml's ``enum ggml_tensor_flag``)."""

    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


# The flags as plain ints: ``Tensor.flags`` holds an int, and IntFlag arithmetic runs in
# Python (about 1 us per ``&``), which graph building and planning do thousands of times.
FLAG_INPUT = int(TensorFlag.INPUT)
FLAG_OUTPUT = int(TensorFlag.OUTPUT)
FLAG_PARAM = int(TensorFlag.PARAM)
FLAG_LOSS = int(TensorFlag.LOSS)
FLAG_COMPUTE = int(TensorFlag.COMPUTE)


def as_type(t: GGType | int) -> GGType:
    """Return ``t`` as a :class:`GGType`, raising :class:`DTypeError` for unknown types."""
    try:
        return GGType(t)
    except ValueError:
        raise DTypeError(
            f"unknown tensor type {t!r}; expected one of {', '.join(x.name for x in GGType)}"
        ) from None


def type_size(t: GGType) -> int:
    """Bytes per element of type ``t`` (ggml_type_size)."""
    return as_type(t).size


def np_dtype(t: GGType) -> np.dtype[Any]:
    """The NumPy dtype of type ``t``."""
    return as_type(t).dtype


def from_np_dtype(dtype: npt.DTypeLike) -> GGType:
    """The :class:`GGType` of a NumPy dtype, or :class:`DTypeError`."""
    dt = np.dtype(dtype)
    if dt not in _FROM_NP:
        raise DTypeError(
            f"NumPy dtype {dt} has no ggopt tensor type; expected float32, float16, int32 or int64"
        )
    return _FROM_NP[dt]
