"""IDX files (the MNIST format), raw or gzip-compressed.

Layout: two zero bytes, a type code, a dimension count ``d >= 1``, then ``d`` big-endian
uint32 sizes and the big-endian data in C order. ggml's MNIST example (``mnist_image_load``,
``mnist_label_load``) skips the fixed 16/8-byte headers; here every header field and the
payload length are checked, and the sizes give the array's shape.
"""

from __future__ import annotations

import gzip
import math
import os
import sys
import zlib
from typing import IO, Any

import numpy as np

from ..errors import DTypeError, ShapeError
from .atomic import atomic_path

__all__ = ["read", "write"]

_GZIP_MAGIC = b"\x1f\x8b"
_TYPE_CODES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_OF_KIND = {dt.newbyteorder("="): code for code, dt in _TYPE_CODES.items()}
_MAX_DIMS = 255  # the format's limit (one byte)
_MAX_NDARRAY_DIMS = 64  # NumPy's (NPY_MAXDIMS); a file with more dimensions cannot be read
_MAX_NDARRAY_BYTES = np.iinfo(np.intp).max
_CHUNK = 1 << 20
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def _fail(path: str | os.PathLike[str], field: str, expected: str, got: str) -> ShapeError:
    return ShapeError(
        f"IDX file {os.fspath(path)!r}: {field}: expected {expected}, got {got} "
        "(ggml's mnist_image_load/mnist_label_load read this format)"
    )


def _read_upto(stream: IO[bytes], n: int) -> bytes:
    parts = []
    while n > 0:
        part = stream.read(min(n, _CHUNK))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _read_payload(stream: IO[bytes], nbytes: int, size_left: int | None) -> tuple[bytearray, int]:
    """Read exactly ``nbytes``; return the buffer and how many bytes the stream really held.

    ``size_left`` (the bytes left in a raw file) lets a wrong length fail before any
    allocation; for a gzip stream the data is read in chunks, never more than promised + 1.
    """
    if size_left is not None and size_left != nbytes:
        return bytearray(), size_left
    buf = bytearray()
    while len(buf) <= nbytes:
        part = stream.read(min(_CHUNK, nbytes + 1 - len(buf)))
        if not part:
            return buf, len(buf)
        buf += part
    rest = 0
    while part:
        part = stream.read(_CHUNK)
        rest += len(part)
    return buf, len(buf) + rest


def _parse(path: str | os.PathLike[str], stream: IO[bytes], size: int | None) -> np.ndarray:
    head = _read_upto(stream, 4)
    if len(head) < 4:
        raise _fail(path, "header", "4 bytes", f"{len(head)}")
    if head[:2] != b"\x00\x00":
        raise _fail(path, "magic bytes 0-1", "00 00", head[:2].hex(" "))
    code, ndim = head[2], head[3]
    if code not in _TYPE_CODES:
        known = ", ".join(f"0x{c:02X}" for c in _TYPE_CODES)
        raise _fail(path, f"type code 0x{code:02X}", f"one of {known}", f"0x{code:02X}")
    if ndim < 1:
        raise _fail(path, "dimension count", ">= 1", f"{ndim}")
    if ndim > _MAX_NDARRAY_DIMS:
        raise _fail(path, "dimension count", f"at most {_MAX_NDARRAY_DIMS} (NumPy's limit)",
                    f"{ndim}")
    raw_dims = _read_upto(stream, 4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise _fail(path, "dimension sizes", f"{4 * ndim} bytes for {ndim} sizes",
                    f"{len(raw_dims)} bytes")
    shape = tuple(int(s) for s in np.frombuffer(raw_dims, dtype=">u4"))
    dtype = _TYPE_CODES[code]
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= s
    size_left = None if size is None else size - 4 - 4 * ndim
    buf, got = _read_payload(stream, nbytes, size_left)
    if got != nbytes:
        sizes = " x ".join(str(s) for s in shape)
        raise _fail(path, "payload", f"{nbytes} bytes ({sizes} of {dtype.name})",
                    f"{got} bytes")
    if math.prod(s for s in shape if s) * dtype.itemsize > _MAX_NDARRAY_BYTES:
        # NumPy refuses such shapes even when a zero size makes the array empty
        raise _fail(path, "dimension sizes", f"a shape NumPy can hold (nonzero sizes times "
                    f"{dtype.itemsize} bytes at most {_MAX_NDARRAY_BYTES})",
                    " x ".join(str(s) for s in shape))
    out = np.frombuffer(buf, dtype=dtype.newbyteorder("=")).reshape(shape)
    if dtype.itemsize > 1 and sys.byteorder == "little":
        out.byteswap(inplace=True)
    return out


def read(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file into a writable, native-endian array of shape ``(n0, n1, ...)``.

    Gzip compression is recognised by the magic bytes ``1f 8b``, whatever the file's name.

    Raises
    ------
    ShapeError
        The header is malformed (magic, type code, dimension count), the payload is shorter
        or longer than the sizes promise, or the gzip stream is corrupt. The message names
        the field.
    """
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if not compressed:
            return _parse(path, raw, os.fstat(raw.fileno()).st_size)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                return _parse(path, stream, None)  # type: ignore[arg-type]  # binary stream
        except _GZIP_ERRORS as exc:
            raise _fail(path, "gzip stream", "a complete, valid gzip stream",
                        f"{type(exc).__name__}: {exc}") from exc


def write(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write ``array`` as an IDX file; gzip-compressed (level 9) when ``path`` ends in ``.gz``.

    The element type picks the type code: uint8 0x08, int8 0x09, int16 0x0B, int32 0x0C,
    float32 0x0D, float64 0x0E. The gzip header carries no timestamp, so the same array
    always gives the same bytes. The file is written under a temporary name in the same
    directory and renamed over ``path`` when complete: a failure never damages an existing file.

    Raises
    ------
    DTypeError
        The element type has no IDX type code.
    ShapeError
        The array has no dimensions, more than 255, or a size that does not fit in uint32.
    """
    arr = np.asarray(array)
    code = _CODE_OF_KIND.get(arr.dtype.newbyteorder("="))
    if code is None:
        kinds = ", ".join(dt.newbyteorder("=").name for dt in _TYPE_CODES.values())
        raise DTypeError(
            f"idx.write {os.fspath(path)!r}: dtype: expected one of {kinds}, got {arr.dtype}"
        )
    if not 1 <= arr.ndim <= _MAX_DIMS:
        raise ShapeError(
            f"idx.write {os.fspath(path)!r}: dimension count: expected 1..{_MAX_DIMS}, "
            f"got {arr.ndim}"
        )
    if any(s > 0xFFFFFFFF for s in arr.shape):
        raise ShapeError(
            f"idx.write {os.fspath(path)!r}: dimension sizes: expected each < 2**32, "
            f"got {arr.shape}"
        )
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = np.ascontiguousarray(arr, dtype=_TYPE_CODES[code]).reshape(-1).view(np.uint8)
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        if os.fspath(path).endswith(".gz"):
            # the gzip header names the target file, not the temporary one
            with gzip.GzipFile(os.fspath(path), "wb", compresslevel=9, fileobj=raw,
                               mtime=0) as out:
                _write_stream(out, header, payload)
        else:
            _write_stream(raw, header, payload)


def _write_stream(out: IO[bytes] | gzip.GzipFile, header: bytes, payload: np.ndarray) -> None:
    out.write(header)
    out.write(payload.data)
