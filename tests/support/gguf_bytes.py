"""GGUF files byte by byte (little-endian v3), for the reader's tests: any key, any tensor
info, counts that lie; and a key spliced into a file another writer made."""

from __future__ import annotations

import struct

ALIGN = 32


def string(raw: bytes) -> bytes:
    """A GGUF string: u64 length, the bytes."""
    return struct.pack("<Q", len(raw)) + raw


def kv(key: bytes, vtype: int, payload: bytes) -> bytes:
    """One key: its name, u32 value type, the value's bytes as given."""
    return string(key) + struct.pack("<I", vtype) + payload


def tensor_info(name: bytes, ne: tuple[int, ...], qtype: int, offset: int) -> bytes:
    """One tensor info: name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset."""
    return (string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d)
            for d in ne) + struct.pack("<IQ", qtype, offset))


def gguf(kvs: list[bytes], infos: list[bytes] = (), data: bytes = b"",  # type: ignore[assignment]
         n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    """A whole file: header (the counts as given, or the true ones), keys, tensor infos,
    padding to 32 when there are tensors, ``data``."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    if infos:
        body += bytes(-len(body) % ALIGN)
    return body + data


def insert_key(data: bytes, key: bytes, vtype: int, payload: bytes) -> bytes:
    """``data`` (a GGUF aligned to 32) with the key first, then a filler string key (the
    padding key below) that keeps the tensor data aligned."""
    entry = kv(key, vtype, payload)
    pad = kv(b"ggopt.pad", 8, string(b""))
    entry += kv(b"ggopt.pad", 8, string(b"x" * (-(len(entry) + len(pad)) % ALIGN)))
    (n_kv,) = struct.unpack_from("<Q", data, 16)
    return data[:16] + struct.pack("<Q", n_kv + 2) + entry + data[24:]
