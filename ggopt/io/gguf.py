"""GGUF files: written through llama.cpp's ``gguf`` package (``gguf_write_to_file``), read
with :mod:`ggopt.io.gguf_reader` (``gguf_init_from_file``).

Tensors go in and come out in NumPy order, shape ``(ne3, ne2, ne1, ne0)``; the file stores
ggml's order ``[ne0, ne1, ...]`` (the gguf writer reverses NumPy shapes itself), so ggml's own
loader sees the tensors with ggml shapes.

Metadata values map to GGUF types as follows: ``str`` STRING, ``bool`` BOOL, ``int`` INT32
(INT64 when it does not fit), ``float`` FLOAT64 (lossless), ``numpy.float32`` FLOAT32, other
NumPy scalars like the Python value they hold; a non-empty list or tuple of one of these kinds
becomes an ARRAY. On load, every value comes back as the Python value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from ..errors import DTypeError, InvalidValueError, ShapeError
from ..quants import QUANTIZED_TYPES, Blocks
from ..types import GGML_MAX_DIMS
from .atomic import atomic_path
from .gguf_reader import open_gguf

__all__ = ["save", "load", "load_blocks"]

_ARCH_KEY = "general.architecture"
_ALIGNMENT_KEY = "general.alignment"
_READER_KEYS = "GGUF."  # prefix of the bookkeeping fields GGUFReader adds
_MAX_NAME = 64  # GGML_MAX_NAME: names must be shorter, counting the terminating NUL
_TENSOR_TYPES: dict[np.dtype[Any], GGMLQuantizationType] = {
    np.dtype(np.float32): GGMLQuantizationType.F32,
    np.dtype(np.float16): GGMLQuantizationType.F16,
    np.dtype(np.int32): GGMLQuantizationType.I32,
}
_TENSOR_DTYPES: dict[GGMLQuantizationType, np.dtype[Any]] = {
    v: k for k, v in _TENSOR_TYPES.items()}
_QUANT_TYPES = {int(t): t for t in QUANTIZED_TYPES}
_INT32 = (-(1 << 31), 1 << 31)
_INT64 = (-(1 << 63), 1 << 63)


def _scalar_type(value: object) -> tuple[GGUFValueType, object] | None:
    """The GGUF type and the value to write for a scalar, or None when it has no GGUF type."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL, bool(value)
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if _INT32[0] <= v < _INT32[1]:
            return GGUFValueType.INT32, v
        if _INT64[0] <= v < _INT64[1]:
            return GGUFValueType.INT64, v
        return None
    if isinstance(value, np.float32):
        return GGUFValueType.FLOAT32, float(value)
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT64, float(value)
    if isinstance(value, str):
        return GGUFValueType.STRING, value
    return None


def _check_utf8(where: str, what: str, text: str) -> None:
    """GGUF stores text as UTF-8: refuse strings that have no UTF-8 form (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidValueError(f"{where}: {what}: expected text that UTF-8 can encode, got "
                                f"{text!r} ({exc.reason} at index {exc.start})") from None


def _kv(path: str, key: object, value: object) -> tuple[object, GGUFValueType, Any]:
    """Check one metadata entry; return (value to write, GGUF type, array element type)."""
    where = f"gguf_write_to_file {path!r}: metadata key {key!r}"
    if not isinstance(key, str) or not key:
        raise InvalidValueError(f"{where}: expected a non-empty str key, got {key!r}")
    _check_utf8(where, "key", key)
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, str):
            _check_utf8(where, "value", item)
    if key.startswith(_READER_KEYS) or key == _ALIGNMENT_KEY:
        raise InvalidValueError(
            f"{where}: expected a key the writer does not manage, got a reserved key "
            f"(keys starting with {_READER_KEYS!r} and {_ALIGNMENT_KEY!r} are reserved)"
        )
    kinds = "str, bool, int, float or a non-empty list of one of these"
    if not isinstance(value, (list, tuple)):
        typed = _scalar_type(value)
        if typed is None:
            raise DTypeError(f"{where}: expected {kinds} (int within int64), got {value!r}")
        return typed[1], typed[0], None
    if not value:
        raise InvalidValueError(f"{where}: expected a non-empty list (the gguf writer cannot "
                                f"store empty arrays), got {value!r}")
    typed_items = [_scalar_type(v) for v in value]
    types = {t[0] if t else None for t in typed_items}
    if types == {GGUFValueType.INT32, GGUFValueType.INT64}:
        types = {GGUFValueType.INT64}
    if None in types or len(types) != 1:
        raise DTypeError(f"{where}: expected {kinds} (one kind per list), got {value!r}")
    return [t[1] for t in typed_items if t is not None], GGUFValueType.ARRAY, types.pop()


def _tensor(path: str, name: object, array: object) -> np.ndarray | Blocks:
    """Check one tensor; return it C-contiguous in native byte order."""
    if isinstance(name, str):
        _check_utf8(f"gguf_write_to_file {path!r}", "tensor name", name)
    if not isinstance(name, str) or not name or len(name.encode()) >= _MAX_NAME:
        raise InvalidValueError(
            f"gguf_write_to_file {path!r}: tensor name: expected a non-empty str of at most "
            f"{_MAX_NAME - 1} UTF-8 bytes (GGML_MAX_NAME), got {name!r}"
        )
    if isinstance(array, Blocks):
        if not 1 <= array.data.ndim <= GGML_MAX_DIMS:
            raise ShapeError(f"gguf_write_to_file {path!r}: tensor {name!r}: expected "
                             f"1..{GGML_MAX_DIMS} dimensions, got {array.data.ndim}")
        return array
    arr = np.asarray(array)
    dtype = arr.dtype.newbyteorder("=")
    if dtype not in _TENSOR_TYPES:
        raise DTypeError(
            f"gguf_write_to_file {path!r}: tensor {name!r}: expected float32, float16 or "
            f"int32, got {arr.dtype} (quantized blocks: pass a ggopt.quants.Blocks)"
        )
    if not 1 <= arr.ndim <= GGML_MAX_DIMS:
        raise ShapeError(
            f"gguf_write_to_file {path!r}: tensor {name!r}: expected 1..{GGML_MAX_DIMS} "
            f"dimensions (GGML_MAX_DIMS), got shape {arr.shape}"
        )
    return np.ascontiguousarray(arr, dtype=dtype)


def save(path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray | Blocks],
         metadata: Mapping[str, object]) -> None:
    """Write ``tensors`` (NumPy order) and ``metadata`` to a GGUF file (``gguf_write_to_file``).

    ``metadata["general.architecture"]`` (a non-empty str) is required. Tensors may be
    float32, float16 or int32 with 1 to 4 dimensions, or quantized
    (:class:`ggopt.quants.Blocks`, written byte for byte); names are shorter than 64 bytes.
    Everything is checked before the file is opened. The file is written under a temporary
    name in the same directory and renamed over ``path`` only when complete, so a failure
    never damages an existing file.

    Raises
    ------
    ShapeError
        Architecture missing, a reserved or empty key, an empty list, a bad tensor name,
        text that UTF-8 cannot encode (a lone surrogate) or a tensor with 0 or more than 4
        dimensions.
    DTypeError
        A metadata value or a tensor element type that GGUF cannot hold here.
    """
    spath = os.fspath(path)
    if not isinstance(metadata, Mapping) or not isinstance(tensors, Mapping):
        raise DTypeError(
            f"gguf_write_to_file {spath!r}: expected tensors and metadata as mappings, got "
            f"{type(tensors).__name__} and {type(metadata).__name__}"
        )
    arch = metadata.get(_ARCH_KEY)
    if not isinstance(arch, str) or not arch:
        raise InvalidValueError(
            f"gguf_write_to_file {spath!r}: metadata[{_ARCH_KEY!r}]: expected a non-empty "
            f"str, got {arch!r}"
        )
    _check_utf8(f"gguf_write_to_file {spath!r}", f"metadata[{_ARCH_KEY!r}]", arch)
    kvs = {k: _kv(spath, k, v) for k, v in metadata.items() if k != _ARCH_KEY}
    arrays = {name: _tensor(spath, name, a) for name, a in tensors.items()}

    with atomic_path(spath) as tmp:
        writer = GGUFWriter(tmp, arch)
        try:
            for key, (value, vtype, sub_type) in kvs.items():
                writer.add_key_value(key, value, vtype, sub_type)
            for name, arr in arrays.items():
                if isinstance(arr, Blocks):  # the raw blocks, byte for byte
                    writer.add_tensor(name, np.ascontiguousarray(arr.data),
                                      raw_dtype=GGMLQuantizationType(int(arr.type)))
                else:
                    writer.add_tensor(name, arr)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def _read(path: str, blocks: bool) -> tuple[dict[str, object], dict[str, np.ndarray | Blocks]]:
    reader = open_gguf(path, f"gguf_init_from_file {path!r}")
    metadata = {name: f.contents() for name, f in reader.fields.items()}
    tensors: dict[str, np.ndarray | Blocks] = {}
    for t in reader.tensors:
        where = f"gguf_init_from_file {path!r}: tensor {t.name!r}"
        if not t.name or len(t.name.encode()) >= _MAX_NAME:
            raise ShapeError(f"{where}: name: expected 1..{_MAX_NAME - 1} bytes "
                             "(GGML_MAX_NAME)")
        if not 1 <= len(t.shape) <= GGML_MAX_DIMS:
            raise ShapeError(f"{where}: n_dims: expected 1..{GGML_MAX_DIMS}, "
                             f"got {len(t.shape)}")
        dtype = _TENSOR_DTYPES.get(t.tensor_type)
        qtype = _QUANT_TYPES.get(int(t.tensor_type))
        if dtype is None and (qtype is None or not blocks):
            if blocks:
                want = f"F32, F16, I32 or {', '.join(q.name for q in QUANTIZED_TYPES)}"
            else:
                want = "F32, F16 or I32"
            hint = " (read quantized tensors with ggopt.io.gguf.load_blocks)" \
                if qtype is not None else ""
            raise DTypeError(f"{where}: type: expected {want}, got {t.tensor_type.name}{hint}")
        if qtype is not None:  # the raw blocks, copied, never dequantized
            tensors[t.name] = Blocks(qtype, np.array(t.data, dtype=np.uint8, order="C"))
        else:
            tensors[t.name] = np.array(t.data, dtype=dtype, order="C")
    align = reader.alignment
    end = reader.data_offset + sum(-(-t.n_bytes // align) * align for t in reader.tensors)
    if end > len(reader.data):  # ggml reads the data section whole, the last padding too
        raise ShapeError(f"gguf_init_from_file {path!r}: data section: expected the file to "
                         f"hold {end} bytes, got {len(reader.data)} (truncated?)")
    return metadata, tensors


def load(path: str | os.PathLike[str]) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Read a GGUF file (ggml's ``gguf_init_from_file``): ``(metadata, tensors)``.

    ``metadata`` holds every key/value pair of the file as Python values; ``tensors`` maps
    names to writable copies in NumPy order, shape ``(ne3, ne2, ne1, ne0)`` trimmed to the
    tensor's dimensions.
    Files with quantized tensors: :func:`load_blocks`.

    Raises
    ------
    ShapeError
        The file is missing, not GGUF, truncated or malformed (the message says what was
        wrong; :func:`ggopt.io.gguf_reader.open_gguf` reads it), text that is not UTF-8.
    DTypeError
        A tensor type other than F32, F16 and I32, or a nested metadata array.
    """
    metadata, tensors = _read(os.fspath(path), False)
    return metadata, {k: v for k, v in tensors.items() if isinstance(v, np.ndarray)}


def load_blocks(path: str | os.PathLike[str]
                ) -> tuple[dict[str, object], dict[str, np.ndarray | Blocks]]:
    """As :func:`load`, but a quantized tensor (a type of :data:`ggopt.quants.QUANTIZED_TYPES`)
    comes back as :class:`ggopt.quants.Blocks`: its raw blocks copied, never dequantized, so
    :func:`save` writes them back byte for byte. A tensor whose ne0 is not whole blocks is a
    ShapeError naming it."""
    return _read(os.fspath(path), True)
