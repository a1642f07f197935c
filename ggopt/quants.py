"""Quantized blocks as NumPy arrays: ggml's quantize / dequantize for the loader and the tests,
and tensors whose memory is an existing buffer of blocks (a GGUF file's mapping).

Raw quantized data is a ``uint8`` array of shape ``(..., row bytes)``: each row holds the
``ne0 / blck_size`` blocks of one row of ``ne0`` elements (as ``gguf``'s ``GGUFReader`` gives
it, and as :meth:`ggopt.Tensor.numpy` shows a quantized tensor). The kernels are
``_kernels/_quant.pyx`` (OpenMP; the same bits for any thread count). The K-quants (Q4_K,
Q5_K, Q6_K) are dequantized and computed with, never quantized: the gguf package, ggopt's
reference, has no quantizer for them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .backend.buffer import Buffer
from .backend.cpu import host_backend
from .backend.cpu.threads import check_n_threads, get_n_threads
from .context import Context, check_whole_blocks, normalize_ne
from .errors import DTypeError, ShapeError, StateError
from .tensor import Tensor
from .types import GGType, as_type, row_size

__all__ = ["QUANTIZED_TYPES", "QUANTIZABLE_TYPES", "Blocks", "dequantize", "quantize",
           "tensor_from_blocks"]

#: the block types ggopt computes with
QUANTIZED_TYPES = tuple(t for t in GGType if t.is_quantized)
#: the block types it can also write from float32 (not the K-quants)
QUANTIZABLE_TYPES = tuple(t for t in QUANTIZED_TYPES if t.can_quantize)


def _quant_type(fn: str, qtype: GGType | int) -> GGType:
    t = as_type(qtype)
    if not t.is_quantized:
        raise DTypeError(f"{fn}: {t.name} is not a quantized type; expected one of "
                         f"{', '.join(q.name for q in QUANTIZED_TYPES)}")
    return t


def _threads(fn: str, n_threads: int | None) -> int:
    return get_n_threads() if n_threads is None else check_n_threads(n_threads, fn)


def _sizes(fn: str, shape: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(operator.index(n) for n in shape)
    except TypeError:
        raise DTypeError(f"{fn}: shape must be a sequence of ints, got {shape!r}") from None


def _as_4d(a: np.ndarray) -> np.ndarray:
    return a.reshape((1,) * (4 - a.ndim) + a.shape) if a.ndim < 4 else a


def dequantize(raw: npt.ArrayLike, qtype: GGType | int, shape: Sequence[int] | None = None,
               n_threads: int | None = None) -> np.ndarray:
    """The float32 values of quantized blocks (ggml's ``dequantize_row_*``).

    ``raw``: uint8 blocks, shape ``(..., row bytes)`` (or any bytes-like object with
    ``shape``); ``shape``: the NumPy shape ``(..., ne0)`` of the result (default: ``raw``'s with
    the last axis in elements). ShapeError when the bytes are not exactly those blocks.
    """
    t = _quant_type("dequantize", qtype)
    arr = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) \
        else np.asarray(raw)
    if arr.dtype != np.uint8:
        raise DTypeError(f"dequantize: raw {t.name} blocks must be uint8, got {arr.dtype}")
    if shape is None:
        if arr.ndim == 0 or arr.ndim > 4:
            raise ShapeError(f"dequantize: raw blocks need 1-4 dims, got shape {arr.shape}")
        if arr.shape[-1] % t.size:
            raise ShapeError(f"dequantize: a row of {arr.shape[-1]} bytes is not whole "
                             f"{t.size}-byte {t.name} blocks (truncated data?)")
        shape = arr.shape[:-1] + (arr.shape[-1] // t.size * t.blck_size,)
    out_shape = _sizes("dequantize", shape)
    if not 1 <= len(out_shape) <= 4 or min(out_shape) < 0:
        raise ShapeError(f"dequantize: shape must be 1-4 non-negative sizes, got {shape}")
    rb = row_size(t, out_shape[-1])
    want = rb * math.prod(out_shape[:-1])  # Python ints: no int64 wrap-around
    if arr.size != want:
        raise ShapeError(f"dequantize: {t.name} data of shape {out_shape} is {want} bytes, "
                         f"got {arr.size} (truncated or wrong shape)")
    src = np.ascontiguousarray(arr).reshape(out_shape[:-1] + (rb,))
    out = np.empty(out_shape, dtype=np.float32)
    from ._kernels import _quant

    _quant.dequantize_rows(_as_4d(src), int(t), _as_4d(out), _threads("dequantize", n_threads))
    return out


def quantize(values: npt.ArrayLike, qtype: GGType | int,
             n_threads: int | None = None) -> np.ndarray:
    """The blocks of float32 ``values`` (ggml's reference ``quantize_row_*_ref``, bit for bit),
    uint8 of shape ``values.shape[:-1] + (row bytes,)``; the last axis must be whole blocks.
    The K-quants (Q4_K, Q5_K, Q6_K) are refused (DTypeError): ggopt reads them, never writes
    them."""
    t = _quant_type("quantize", qtype)
    if not t.can_quantize:
        raise DTypeError(f"quantize: {t.name} can be loaded, dequantized and computed with, "
                         f"not quantized (no reference quantizer to match bit for bit); "
                         f"expected one of {', '.join(q.name for q in QUANTIZABLE_TYPES)}")
    arr = np.asarray(values)
    if arr.dtype != np.float32:
        raise DTypeError(f"quantize: values must be float32, got {arr.dtype}")
    if not 1 <= arr.ndim <= 4:
        raise ShapeError(f"quantize: values need 1-4 dims, got shape {arr.shape}")
    rb = row_size(t, arr.shape[-1])
    src = np.ascontiguousarray(arr)
    out = np.empty(arr.shape[:-1] + (rb,), dtype=np.uint8)
    from ._kernels import _quant

    _quant.quantize_rows(_as_4d(src), int(t), _as_4d(out), _threads("quantize", n_threads))
    return out


@dataclass(frozen=True)
class Blocks:
    """A quantized array: its type and its raw blocks, uint8 of shape ``(..., row bytes)``
    (what :func:`ggopt.io.gguf.load` returns for a quantized tensor and ``save`` takes).
    The data is checked on creation (ShapeError / DTypeError)."""

    type: GGType
    data: np.ndarray

    def __post_init__(self) -> None:
        t = _quant_type("Blocks", self.type)
        object.__setattr__(self, "type", t)
        if not isinstance(self.data, np.ndarray) or self.data.dtype != np.uint8:
            raise DTypeError(f"Blocks: {t.name} data must be a uint8 array of raw blocks, got "
                             f"{getattr(self.data, 'dtype', type(self.data).__name__)}")
        if not 1 <= self.data.ndim <= 4 or self.data.shape[-1] % t.size:
            raise ShapeError(f"Blocks: {t.name} data of shape {self.data.shape} is not 1-4 dims "
                             f"of whole {t.size}-byte blocks per row (truncated?)")

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy shape in elements: ``(..., ne0)``."""
        d = self.data.shape
        return d[:-1] + (d[-1] // self.type.size * self.type.blck_size,)

    def dequantize(self, n_threads: int | None = None) -> np.ndarray:
        """The float32 values (:func:`dequantize`)."""
        return dequantize(self.data, self.type, n_threads=n_threads)


def _bytes_of(fn: str, name: str, data: Any) -> np.ndarray:
    """``data`` (a bytes-like object or a NumPy array of plain numbers) as flat uint8."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise DTypeError(f"{fn}: tensor '{name}': data of Python objects are not bytes")
        if not data.flags.c_contiguous:  # its memory could not be the tensor's (a copy would)
            raise ShapeError(f"{fn}: tensor '{name}': the array must be C-contiguous (its "
                             f"memory becomes the tensor's), got strides {data.strides}")
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise DTypeError(f"{fn}: tensor '{name}': data must be bytes-like or a NumPy array, "
                         f"got {type(data).__name__}") from None


def tensor_from_blocks(ctx: Context, qtype: GGType | int, ne: Sequence[int], data: Any,
                       name: str = "") -> Tensor:
    """A new tensor of ``ctx`` whose memory *is* ``data`` (no copy): a bytes-like object or a
    uint8 array (e.g. a slice of a ``np.memmap`` of a GGUF file) holding exactly the tensor's
    bytes. Read-only data stays read-only: such a tensor can be read by ops, never written.

    The loader maps weights this way; any type works (F32 too). ShapeError, before anything is
    created, when the size is not the tensor's or the array is not C-contiguous.
    """
    fn = "tensor_from_blocks"
    if not isinstance(ctx, Context):
        raise DTypeError(f"{fn}: ctx must be a ggopt.Context, got {type(ctx).__name__}")
    if not isinstance(name, str):
        raise DTypeError(f"{fn}: name must be a str, got {type(name).__name__}")
    t_type = as_type(qtype)
    ne4 = normalize_ne(ne)
    check_whole_blocks(fn, t_type, ne4, name)
    arr = _bytes_of(fn, name, data)
    probe = Tensor(ctx, t_type, ne4)
    if arr.size != probe.nbytes():
        raise ShapeError(f"tensor_from_blocks: tensor '{name}' ({t_type.name}, ne={list(ne4)}) "
                         f"is {probe.nbytes()} bytes, the data {arr.size} (truncated?)")
    if not ctx.no_alloc:
        raise StateError("tensor_from_blocks: the context must be no_alloc=True (its tensors "
                         "would otherwise get memory of their own)")
    t = ctx.new_tensor(t_type, ne4)
    t.name = name
    t.buffer, t.offset = Buffer(host_backend(), int(arr.size), arr), 0
    return t
