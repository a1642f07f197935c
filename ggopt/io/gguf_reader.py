"""The one GGUF reader of ggopt: metadata and tensor table read from a memory map, bounded.

Every metadata and tensor-info read (models, adapters, tokenizers, checkpoints, the export's
copy of the keys) goes through :func:`open_gguf`. Its memory is linear in the file with a small
constant: a numeric array is a NumPy view of the map, a string array is the map plus one int64
offset per item (its items are sliced out when asked for, never all made up front), tensor data
are views of the map. Nesting is refused (llama.cpp reads no array of arrays), counts and
sizes are checked against the file before anything is read, every tensor's type, dimensions,
offset and bytes are checked as ``gguf_init_from_file`` checks them, and every failure is a
GgoptError (:class:`ShapeError` for the layout and for text that is not UTF-8,
:class:`DTypeError` for a type) naming the key or tensor.

Layout (v2/v3, either byte order): ``GGUF``, u32 version, u64 n_tensors, u64 n_kv; each key a
string (u64 length + bytes), a u32 value type and the value (an array: u32 item type, u64
count, the items); each tensor a string name, u32 n_dims, u64 ne[n_dims], u32 type, u64
offset; padding to ``general.alignment`` (default 32); the data.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import DTypeError, ShapeError

__all__ = ["GGUFFile", "Field", "TensorInfo", "StringArray", "open_gguf", "MAX_DIMS"]

MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
_V = GGUFValueType
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_DTYPES = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8",
           11: "i8", 12: "f8"}
_STRING, _ARRAY = 8, 9
#: tensor types whose data come back typed (the others as raw bytes, as gguf's reader does)
_TYPED = {GGMLQuantizationType.F32: "f4", GGMLQuantizationType.F16: "f2",
          GGMLQuantizationType.F64: "f8", GGMLQuantizationType.I8: "i1",
          GGMLQuantizationType.I16: "i2", GGMLQuantizationType.I32: "i4",
          GGMLQuantizationType.I64: "i8"}
_INT64_MAX = (1 << 63) - 1


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ShapeError(f"{what}: expected UTF-8 text, got {raw[:40]!r} ({exc.reason} at "
                         f"byte {exc.start}; a damaged file?)") from None


class StringArray(Sequence[bytes]):
    """The items of a GGUF string array as raw bytes, sliced from the map when asked for."""

    def __init__(self, buf: memoryview, starts: np.ndarray, end: int) -> None:
        self._buf, self._starts, self._end = buf, starts, end

    def __len__(self) -> int:
        return len(self._starts)

    def _item(self, i: int) -> bytes:
        start = int(self._starts[i])
        stop = int(self._starts[i + 1]) - 8 if i + 1 < len(self._starts) else self._end
        return bytes(self._buf[start:stop])

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("string array index out of range")
        return self._item(i % n)

    def __iter__(self) -> Iterator[bytes]:
        if not len(self._starts):
            return iter(())
        starts = self._starts.tolist()
        base = starts[0]
        region = self._buf[base:self._end].tobytes()  # one copy of the array's bytes
        ends = [s - 8 - base for s in starts[1:]] + [self._end - base]
        return (region[a - base:b] for a, b in zip(starts, ends))


@dataclasses.dataclass(frozen=True)
class Field:
    """One key: ``types`` ``[T]`` for a scalar, ``[ARRAY, T]`` for an array of T (also when
    empty); ``value`` as read: a Python scalar, bytes for a string, a NumPy array (a view of
    the map) for numbers, a :class:`StringArray` for strings."""

    name: str
    types: list[GGUFValueType]
    value: Any

    def contents(self) -> Any:
        """The value as Python: a str (ShapeError naming the key when not UTF-8), a
        number or bool, or a list of them for an array."""
        if self.types[0] == _V.STRING:
            return _decode(self.value, f"key {self.name!r}")
        if self.types[0] != _V.ARRAY:
            return self.value
        if self.types[1] == _V.STRING:
            return [_decode(v, f"key {self.name!r} item {i}") for i, v in enumerate(self.value)]
        return self.value.tolist()

    def raw(self) -> Any:
        """As :meth:`contents`, but strings as the file's bytes (a token need not be UTF-8)."""
        if self.types[0] == _V.ARRAY:
            return list(self.value) if self.types[1] == _V.STRING else self.value.tolist()
        return self.value


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor: ggml ``shape`` (ne0 first), type, byte size, absolute ``data_offset`` and
    ``data``, a read-only view of the map (typed for F32/F16/F64/I8-I64 in the file's byte
    order, NumPy order; raw bytes of the blocks otherwise, one row of blocks per last axis)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """A GGUF file read by :func:`open_gguf` (``data``: the read-only map of the whole file)."""

    path: str
    data: np.ndarray
    byte_order: str  # "I": this machine's, "S": swapped
    version: int
    fields: dict[str, Field]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int


class _Cursor:
    def __init__(self, buf: memoryview, order: str, where: str) -> None:
        self.buf, self.order, self.pos, self.where = buf, order, 0, where
        self.size = len(buf)

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or n > self.size - start:
            raise ShapeError(f"{self.where}: {what}: needs {n} bytes at offset {start}, the file "
                             f"has {self.size} (truncated or a damaged count?)")
        self.pos = start + n
        return start

    def scalar(self, code: str, what: str) -> Any:
        fmt = self.order + code
        return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> bytes:
        n = self.scalar("Q", what)
        start = self.need(n, what)
        return bytes(self.buf[start:start + n])

    def strings(self, count: int, what: str) -> StringArray:
        """``count`` strings stepped over: their starts kept, nothing copied."""
        if count > (self.size - self.pos) // 8:
            raise ShapeError(f"{self.where}: {what}: {count} strings cannot fit in the "
                             f"{self.size - self.pos} bytes left of the file")
        buf, size, fmt = self.buf, self.size, self.order + "Q"
        starts = array("q")
        append, unpack = starts.append, struct.unpack_from
        pos = self.pos
        for _ in range(count):
            if size - pos < 8:
                raise ShapeError(f"{self.where}: {what}: the file ends inside the array "
                                 f"(truncated?)")
            (n,) = unpack(fmt, buf, pos)
            pos += 8
            if n > size - pos:
                raise ShapeError(f"{self.where}: {what}: a string of {n} bytes at offset "
                                 f"{pos}, the file has {size} (truncated?)")
            append(pos)
            pos += n
        self.pos = pos
        return StringArray(buf, np.frombuffer(starts, np.int64) if count else
                           np.zeros(0, np.int64), pos)


def _value(cur: _Cursor, vtype: int, key: str) -> tuple[list[GGUFValueType], Any]:
    what = f"key {key!r}"
    if vtype in _SCALARS:
        return [_V(vtype)], cur.scalar(_SCALARS[vtype], what)
    if vtype == _STRING:
        return [_V.STRING], cur.string(what)
    if vtype != _ARRAY:
        raise DTypeError(f"{cur.where}: {what}: unknown GGUF value type {vtype}")
    item = cur.scalar("I", what)
    count = cur.scalar("Q", what)
    if item == _ARRAY:
        raise DTypeError(f"{cur.where}: {what}: expected a scalar or a flat array, got nested "
                         f"arrays (GGUF readers, llama.cpp's too, refuse them)")
    if item == _STRING:
        return [_V.ARRAY, _V.STRING], cur.strings(count, what)
    if item not in _DTYPES:
        raise DTypeError(f"{cur.where}: {what}: array of unknown GGUF value type {item}")
    dtype = np.dtype(cur.order + _DTYPES[item])
    if count > (cur.size - cur.pos) // dtype.itemsize:
        raise ShapeError(f"{cur.where}: {what}: {count} items of {dtype.itemsize} bytes cannot "
                         f"fit in the {cur.size - cur.pos} bytes left of the file")
    start = cur.need(count * dtype.itemsize, what)
    return [_V.ARRAY, _V(item)], np.frombuffer(cur.buf, dtype, count, start)


def _tensor_info(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    what = f"tensor {index}"
    raw = cur.string(f"{what} name")
    name = _decode(raw, f"{cur.where}: {what} name")
    what = f"tensor {name!r}"
    n_dims = cur.scalar("I", f"{what} n_dims")
    if n_dims > MAX_DIMS:
        raise ShapeError(f"{cur.where}: {what}: n_dims {n_dims}, expected at most {MAX_DIMS} "
                         f"(GGML_MAX_DIMS)")
    ne = tuple(cur.scalar("Q", f"{what} shape") for _ in range(n_dims))
    n = 1
    for d in ne:
        if d > _INT64_MAX or (d and n > _INT64_MAX // d):
            raise ShapeError(f"{cur.where}: {what}: shape {list(ne)} has more elements than "
                             f"int64 holds")
        n *= d
    qtype = cur.scalar("I", f"{what} type")
    offset = cur.scalar("Q", f"{what} offset")
    return name, ne, qtype, offset


def _tensor(buf: np.ndarray, order: str, name: str, ne: tuple[int, ...], code: int,
            offset: int, where: str) -> TensorInfo:
    what = f"{where}: tensor {name!r}"
    try:
        qtype = GGMLQuantizationType(code)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise DTypeError(f"{what}: unknown ggml type {code}") from None
    ne0 = ne[0] if ne else 1
    if ne0 % block:
        raise ShapeError(f"{what}: ne0 = {ne0} is not a whole number of {block}-element "
                         f"{qtype.name} blocks")
    n_elements = int(np.prod(ne, dtype=object)) if ne else 1
    n_bytes = n_elements // block * type_size
    if n_bytes > len(buf) - offset:
        have = max(len(buf) - offset, 0)
        raise ShapeError(f"{what}: the file ends inside its data ({have} of {n_bytes} bytes "
                         f"at offset {offset}; truncated?)")
    dims = tuple(reversed(ne)) or (1,)
    if qtype in _TYPED:
        dtype = np.dtype(order + _TYPED[qtype])
        data = np.frombuffer(buf, dtype, n_elements, offset).reshape(dims)
    else:
        rows = dims[:-1] + (dims[-1] // block * type_size,)
        data = np.frombuffer(buf, np.uint8, n_bytes, offset).reshape(rows)
    return TensorInfo(name, qtype, ne, n_elements, n_bytes, offset, data)


def open_gguf(path: str | os.PathLike[str], where: str | None = None, *,
              tensors: bool = True) -> GGUFFile:
    """Read the GGUF file ``path``: every key and the tensor table (no tensor data copied).

    ``where`` starts every error message (default: the path); ``tensors=False`` reads the
    keys only (``tensors`` comes back empty).

    Raises
    ------
    OSError
        The file cannot be opened (missing, a directory, no permission).
    ShapeError
        Not GGUF, an unsupported version, a count, length, shape
        or offset the file cannot hold (truncated or damaged), a duplicate key or tensor, a
        key or tensor name that is not UTF-8.
    DTypeError
        An unknown value or tensor type, nested arrays, ``general.alignment`` not a UINT32
        power of two.
    """
    spath = os.fspath(path)
    where = where or repr(spath)
    with open(spath, "rb") as fh:  # a missing or unreadable file: OSError
        empty = os.fstat(fh.fileno()).st_size == 0
    data = np.zeros(0, np.uint8) if empty else np.memmap(spath, mode="r")
    return _parse(spath, data, where, tensors)


def _parse(spath: str, data: np.ndarray, where: str, with_tensors: bool) -> GGUFFile:
    buf = memoryview(data.data).cast("B") if len(data) else memoryview(b"")
    if bytes(buf[:4]) != b"GGUF":
        raise ShapeError(f"{where}: not a GGUF file (magic {bytes(buf[:4])!r})")
    if len(buf) < 8:
        raise ShapeError(f"{where}: truncated GGUF header ({len(buf)} bytes)")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<" if version & 0xFFFF else ">"
    cur = _Cursor(buf, order, where)
    cur.pos = 4
    version = cur.scalar("I", "version")
    if version not in (2, 3):
        raise ShapeError(f"{where}: GGUF version {version}, expected 2 or 3")
    n_tensors = cur.scalar("Q", "tensor count")
    n_kv = cur.scalar("Q", "key/value count")
    left = cur.size - cur.pos
    if n_kv > left // 13 or n_tensors > left // 24 or 13 * n_kv + 24 * n_tensors > left:
        # 13 and 24 bytes: the smallest key and the smallest tensor info
        raise ShapeError(f"{where}: {n_kv} keys and {n_tensors} tensors cannot fit in the "
                         f"{left} bytes left of the file (a damaged count?)")
    fields: dict[str, Field] = {}
    for i in range(n_kv):
        raw = cur.string(f"key {i}")
        key = _decode(raw, f"{where}: key {i}")
        if key in fields:
            raise ShapeError(f"{where}: key {key!r} appears twice")
        types, value = _value(cur, cur.scalar("I", f"key {key!r} type"), key)
        fields[key] = Field(key, types, value)
    if not with_tensors:
        n_tensors = 0
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    alignment = DEFAULT_ALIGNMENT
    field = fields.get("general.alignment")
    if field is not None:
        if field.types != [_V.UINT32] or not field.value or field.value & (field.value - 1):
            raise DTypeError(f"{where}: key 'general.alignment': expected a UINT32 power of "
                             f"two, got {field.value!r} ({'/'.join(t.name for t in field.types)})")
        alignment = int(field.value)
    data_offset = -(-cur.pos // alignment) * alignment
    if infos and data_offset > cur.size:
        raise ShapeError(f"{where}: the data section starts at {data_offset}, past the end of "
                         f"the file ({cur.size} bytes; truncated?)")
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    expected = 0
    for name, ne, code, offset in infos:
        if name in names:
            raise ShapeError(f"{where}: tensor {name!r} appears twice")
        names.add(name)
        if offset != expected:
            raise ShapeError(f"{where}: tensor {name!r}: data offset {offset}, expected "
                             f"{expected} (tensors follow each other, padded to {alignment})")
        t = _tensor(data, order, name, ne, code, data_offset + offset, where)
        expected += -(-t.n_bytes // alignment) * alignment
        tensors.append(t)
    return GGUFFile(spath, data, "I" if order == ("<" if _LITTLE else ">") else "S", version,
                    fields, tensors, alignment, data_offset)


_LITTLE = np.little_endian
