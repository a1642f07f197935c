"""Element types and tensor flags, with ggml's numeric values."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import DTypeError, ShapeError

__all__ = [
    "GGType", "TensorFlag", "F32", "F16", "I32", "I64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16",
    "type_size", "blck_size", "row_size", "np_dtype", "GGML_MAX_DIMS", "FLAG_INPUT",
    "FLAG_OUTPUT", "FLAG_PARAM", "FLAG_LOSS", "FLAG_COMPUTE",
]

GGML_MAX_DIMS = 4


class GGType(enum.IntEnum):
    """Tensor element types (values are ggml's ``enum ggml_type``).

    BF16's NumPy view is its raw bits, ``uint16`` (:mod:`ggopt.lowp` converts them). The
    quantized types hold blocks of :attr:`blck_size` elements in :attr:`size` bytes
    (ggml's ``type_traits``); their NumPy view is the raw blocks, ``uint8`` (see
    :attr:`dtype`).
    """

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    I32 = 26
    I64 = 27
    BF16 = 30

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of the tensor's view: the element type, or ``uint8`` (the raw block
        bytes) for a quantized type."""
        return _NP_DTYPES[self]

    @property
    def size(self) -> int:
        """Bytes per block of :attr:`blck_size` elements (ggml_type_size)."""
        return _TYPE_SIZES[self]

    @property
    def blck_size(self) -> int:
        """Elements per block: 1, 32 for the quantized types, 256 for the K-quants
        (ggml_blck_size)."""
        return _BLCK_SIZES.get(self, 1)

    @property
    def is_quantized(self) -> bool:
        """True for the block types (ggml_is_quantized)."""
        return self in _BLCK_SIZES

    @property
    def can_quantize(self) -> bool:
        """True for the block types ggopt can write from float32 (ggml's reference quantizer,
        bit for bit); the K-quants are read and computed with only."""
        return self in _QUANTIZABLE

    @property
    def is_float(self) -> bool:
        return self in (GGType.F32, GGType.F16, GGType.BF16)

    @property
    def is_lowp(self) -> bool:
        """True for F16 and BF16: a weight of this type multiplies activations rounded to it
        (its ggml ``vec_dot_type``), with F32 sums."""
        return self in (GGType.F16, GGType.BF16)


F32 = GGType.F32
F16 = GGType.F16
I32 = GGType.I32
I64 = GGType.I64
Q4_0 = GGType.Q4_0
Q4_1 = GGType.Q4_1
Q5_0 = GGType.Q5_0
Q5_1 = GGType.Q5_1
Q8_0 = GGType.Q8_0
Q2_K = GGType.Q2_K
Q3_K = GGType.Q3_K
Q4_K = GGType.Q4_K
Q5_K = GGType.Q5_K
Q6_K = GGType.Q6_K
BF16 = GGType.BF16

_QUANTIZABLE = frozenset({Q4_0, Q4_1, Q5_0, Q5_1, Q8_0})
#: elements per block of the quantized types (ggml's QK4_0 ... QK8_0, and QK_K)
_BLCK_SIZES: dict[GGType, int] = {t: 32 for t in _QUANTIZABLE}
_BLCK_SIZES.update({t: 256 for t in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)})
_NP_DTYPES: dict[GGType, np.dtype[Any]] = {
    GGType.F32: np.dtype(np.float32),
    GGType.F16: np.dtype(np.float16),
    GGType.I32: np.dtype(np.int32),
    GGType.I64: np.dtype(np.int64),
}
_FROM_NP = {v: k for k, v in _NP_DTYPES.items()}
_NP_DTYPES[GGType.BF16] = np.dtype(np.uint16)  # raw bits; uint16 arrays stay no tensor type
# block types: an F16 scale d (and an F16 minimum m for the _1 types), for Q5 4 bytes of high
# bits qh, then 16 bytes of nibbles (Q4, Q5) or 32 int8 (Q8_0). K-quants: Q2_K is 16 bytes of
# 4-bit scale and minimum pairs, 64 bytes of 2-bit codes, d, dmin; Q3_K is 32 bytes of third
# bits, 64 of 2-bit codes, 12 of packed 6-bit scales, d; Q4_K is d, dmin, 12 bytes of packed
# 6-bit scales and minimums, 128 bytes of nibbles; Q5_K is Q4_K with 32 bytes of fifth bits
# before the nibbles; Q6_K is 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8
# scales, d
_QUANT_BYTES = {Q4_0: 2 + 16, Q4_1: 4 + 16, Q5_0: 2 + 4 + 16, Q5_1: 4 + 4 + 16, Q8_0: 2 + 32,
                Q2_K: 16 + 64 + 2 + 2, Q3_K: 32 + 64 + 12 + 2, Q4_K: 2 + 2 + 12 + 128,
                Q5_K: 2 + 2 + 12 + 32 + 128, Q6_K: 128 + 64 + 16 + 2}
_NP_DTYPES.update({t: np.dtype(np.uint8) for t in _QUANT_BYTES})
_TYPE_SIZES: dict[GGType, int] = {t: int(_NP_DTYPES[t].itemsize) for t in _FROM_NP.values()}
_TYPE_SIZES.update(_QUANT_BYTES)
_TYPE_SIZES[GGType.BF16] = 2


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
    """Return ``t`` as a :class:`GGType`, raising :class:`DTypeError` for unknown types (and
    for a bool or float, which ``GGType`` would take as an int)."""
    try:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise ValueError(t)
        return GGType(t)
    except ValueError:
        raise DTypeError(
            f"unknown tensor type {t!r}; expected one of {', '.join(x.name for x in GGType)}"
        ) from None


def type_size(t: GGType) -> int:
    """Bytes per block of type ``t``: per element for the plain types (ggml_type_size)."""
    return as_type(t).size


def blck_size(t: GGType) -> int:
    """Elements per block of type ``t`` (ggml_blck_size)."""
    return as_type(t).blck_size


def row_size(t: GGType, ne: int) -> int:
    """Bytes of ``ne`` elements of type ``t`` (ggml_row_size); ``ne`` must be a whole number
    of blocks (ShapeError otherwise)."""
    tt = as_type(t)
    if ne % tt.blck_size:
        raise ShapeError(f"a row of {ne} {tt.name} elements is not a whole number of "
                         f"{tt.blck_size}-element blocks")
    return tt.size * (ne // tt.blck_size)


def np_dtype(t: GGType) -> np.dtype[Any]:
    """The NumPy dtype of type ``t`` (``uint8``, the raw blocks, for a quantized type)."""
    return as_type(t).dtype


def from_np_dtype(dtype: npt.DTypeLike) -> GGType:
    """The :class:`GGType` of a NumPy dtype, or :class:`DTypeError`."""
    dt = np.dtype(dtype)
    if dt not in _FROM_NP:
        raise DTypeError(
            f"NumPy dtype {dt} has no ggopt tensor type; expected float32, float16, int32 or int64"
        )
    return _FROM_NP[dt]
