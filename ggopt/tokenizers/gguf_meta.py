"""A fast reader of a GGUF file's key/value section (the tensors are not touched).

``gguf.GGUFReader`` builds a NumPy array for every string of every array, which takes
seconds for a vocabulary of 150k tokens and 280k merges; the tokenizer only needs the
metadata, read here straight from the memory-mapped file.
"""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from ggopt.errors import InvalidValueError, ShapeError

__all__ = ["read_metadata", "Value"]

#: (type ids, value): ``(T,)`` with a Python scalar, str as bytes; ``(9, T)`` with a list of
#: bytes (strings) or a NumPy array (numbers).
Value = tuple[tuple[int, ...], object]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise ShapeError(f"{self.path!r}: {what}: needs {n} bytes at offset {start}, the "
                             f"file has {len(self.buf)} (truncated?)")
        self.pos = start + n
        return start

    def unpack(self, fmt: str, what: str) -> object:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> bytes:
        n = int(self.unpack("<Q", what))  # type: ignore[call-overload]
        start = self.take(n, what)
        return bytes(self.buf[start:start + n])


def _value(cur: _Cursor, vtype: int, key: str) -> Value:
    if vtype == _STRING:
        return (vtype,), cur.string(key)
    if vtype in _SCALARS:
        return (vtype,), cur.unpack(_SCALARS[vtype], key)
    if vtype != _ARRAY:
        raise ShapeError(f"{cur.path!r}: {key}: unknown GGUF value type {vtype}")
    etype = int(cur.unpack("<I", key))  # type: ignore[call-overload]
    count = int(cur.unpack("<Q", key))  # type: ignore[call-overload]
    if etype == _STRING:
        buf, pos, size = cur.buf, cur.pos, len(cur.buf)
        items: list[bytes] = []
        unpack = struct.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise ShapeError(f"{cur.path!r}: {key}: truncated string array")
            (n,) = unpack("<Q", buf, pos)
            pos += 8
            if pos + n > size:
                raise ShapeError(f"{cur.path!r}: {key}: truncated string array")
            items.append(buf[pos:pos + n])
            pos += n
        cur.pos = pos
        return (vtype, etype), items
    if etype not in _DTYPES:
        raise ShapeError(f"{cur.path!r}: {key}: array of GGUF type {etype} (nested arrays "
                         "or unknown)")
    dtype = np.dtype(_DTYPES[etype])
    start = cur.take(count * dtype.itemsize, key)
    return (vtype, etype), np.frombuffer(cur.buf, dtype, count, start).copy()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Value]:
    """Every key/value pair of the GGUF file ``path``."""
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            buf: mmap.mmap | bytes = (mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                                      if size else b"")
    except FileNotFoundError:
        raise InvalidValueError(f"{spath!r}: no such file") from None
    except OSError as exc:
        raise InvalidValueError(f"{spath!r}: cannot read ({exc.strerror})") from None
    try:
        return _parse(_Cursor(buf, spath))
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def _parse(cur: _Cursor) -> dict[str, Value]:
    buf, spath = cur.buf, cur.path
    start = cur.take(4, "magic")
    if bytes(buf[start:start + 4]) != b"GGUF":
        raise ShapeError(f"{spath!r}: not a GGUF file (magic {bytes(buf[:4])!r})")
    version = int(cur.unpack("<I", "version"))  # type: ignore[call-overload]
    if version not in (2, 3):
        raise ShapeError(f"{spath!r}: GGUF version {version} (expected 2 or 3; a "
                         "big-endian file?)")
    cur.unpack("<Q", "tensor count")
    n_kv = int(cur.unpack("<Q", "key/value count"))  # type: ignore[call-overload]
    out: dict[str, Value] = {}
    for i in range(n_kv):
        raw_key = cur.string(f"key {i}")
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise ShapeError(f"{spath!r}: key {i} is not UTF-8: {raw_key!r}") from None
        vtype = int(cur.unpack("<I", key))  # type: ignore[call-overload]
        out[key] = _value(cur, vtype, key)
    return out
