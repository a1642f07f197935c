"""A GGUF file's header read fast: the scalar keys, the lengths of the array keys (not their
items: a vocabulary of 49k strings is stepped over, not decoded) and the tensor list (ggml
shape and type per name), no tensor data. ``gguf.GGUFReader`` decodes every array item, which
takes seconds for a model's vocabulary; the checks before a model loads need a few keys.

Layout (v2/v3, either byte order): ``GGUF``, u32 version, u64 n_tensors, u64 n_kv; each key
a string (u64 length + UTF-8), a u32 value type and the value (an array: u32 item type, u64
count, the items); each tensor a string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from ..errors import ShapeError

__all__ = ["read_header"]

# value type -> struct code of a fixed-size scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf: Any, order: str) -> None:
        self.buf, self.order, self.pos = buf, order, 0

    def scalar(self, code: str) -> Any:
        fmt = self.order + code
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self, decode: bool = True) -> str:
        n = self.scalar("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("a string past the end of the file")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8") if decode else ""

    def value(self, vtype: int) -> tuple[Any, int | None]:
        """``(value, None)`` for a scalar or string; ``(None, count)`` for an array (skipped)."""
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype]), None
        if vtype == _STRING:
            return self.string(), None
        if vtype != _ARRAY:
            raise ValueError(f"unknown value type {vtype}")
        item, count = self.scalar("I"), self.scalar("Q")
        if item in _SCALARS:
            size = struct.calcsize(_SCALARS[item])
            if self.pos + size * count > len(self.buf):
                raise struct.error("an array past the end of the file")
            self.pos += size * count
        elif item == _STRING:
            for _ in range(count):
                self.string(decode=False)
        else:
            raise ValueError(f"array items of type {item}")
        return None, count


def read_header(path: str | os.PathLike[str], where: str
                ) -> tuple[dict[str, Any], dict[str, int], dict[str, tuple[tuple[int, ...], int]]]:
    """``(scalars, array_lengths, tensors)`` of a GGUF file: key -> value for scalar and
    string keys, key -> item count for array keys, tensor name -> (ggml ne, type number).

    Raises ShapeError naming ``where`` when the file is missing, unreadable, not GGUF,
    truncated or damaged."""
    spath = os.fspath(path)
    if not os.path.isfile(spath):
        raise ShapeError(f"{where}: no such file")
    try:
        with open(spath, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(memoryview(m), where)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ShapeError(f"{where}: not a readable GGUF file (truncated or damaged?): "
                         f"{type(exc).__name__}: {exc}") from None


def _parse(buf: memoryview, where: str
           ) -> tuple[dict[str, Any], dict[str, int], dict[str, tuple[tuple[int, ...], int]]]:
    try:
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic")
        (version,) = struct.unpack_from("<I", buf, 4)
        order = "<" if version & 0xFFFF else ">"
        cur = _Cursor(buf, order)
        cur.pos = 4
        cur.scalar("I")
        n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
        scalars: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            value, count = cur.value(cur.scalar("I"))
            if count is None:
                scalars[key] = value
            else:
                lengths[key] = count
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            name = cur.string()
            ne = tuple(int(cur.scalar("Q")) for _ in range(cur.scalar("I")))
            qtype = cur.scalar("I")
            cur.scalar("Q")
            tensors[name] = (ne, qtype)
        return scalars, lengths, tensors
    finally:
        buf.release()
