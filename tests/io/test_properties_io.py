"""Property tests of the file loaders: mutated or truncated IDX and GGUF files either load
correctly or raise a GgoptError; no other exception ever escapes.

The number of examples comes from the hypothesis profile (tests/conftest.py): small by
default, thousands with ``GGOPT_HYPOTHESIS_PROFILE=fuzz``.
"""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ggopt import GgoptError  # noqa: E402
from ggopt.io import gguf as ggio  # noqa: E402
from ggopt.io import idx  # noqa: E402

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


# --- mutations ---------------------------------------------------------------------------------


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with a few random edits: byte changes, a cut, an insertion or an append."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "set", "truncate", "insert", "append", "zero"]))
        if kind == "set" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
        elif kind == "zero" and buf:  # a 4- or 8-byte field set to an extreme value
            i = draw(st.integers(0, len(buf) - 1))
            width = draw(st.sampled_from([4, 8]))
            fill = draw(st.sampled_from([b"\x00", b"\xff", b"\x7f"]))
            buf[i:i + width] = fill * width
        elif kind == "truncate":
            del buf[draw(st.integers(0, len(buf))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(buf)))
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            buf += draw(st.binary(min_size=1, max_size=16))
    return bytes(buf)


# --- IDX -----------------------------------------------------------------------------------------


@st.composite
def idx_arrays(draw) -> np.ndarray:
    code = draw(st.sampled_from(sorted(_IDX_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    n = int(np.prod(shape))
    raw = draw(st.binary(min_size=n * np.dtype(_IDX_DTYPES[code]).itemsize,
                         max_size=n * np.dtype(_IDX_DTYPES[code]).itemsize))
    dtype = np.dtype(_IDX_DTYPES[code])
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_reference(data: bytes) -> np.ndarray | None:
    """The array an IDX reader must return for ``data``, or None when it must refuse."""
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read()
        except Exception:  # noqa: BLE001 - any corrupt stream must be refused
            return None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_DTYPES:
        return None
    ndim = data[3]
    if not 1 <= ndim <= 64 or len(data) < 4 + 4 * ndim:
        return None
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    payload = data[4 + 4 * ndim:]
    if len(payload) != dtype.itemsize * int(np.prod(shape, dtype=object)):
        return None
    try:
        return np.frombuffer(payload, dtype=dtype).reshape(shape)
    except ValueError:  # a shape NumPy cannot hold
        return None


def _idx_file(arr: np.ndarray, gz: bool, tmp: Path) -> bytes:
    path = tmp / ("a.idx.gz" if gz else "a.idx")
    idx.write(path, arr)
    return path.read_bytes()


@given(arr=idx_arrays(), gz=st.booleans(), data=st.data())
def test_mutated_idx_files_load_correctly_or_raise_ggopt_errors(tmp_path_factory, arr, gz,
                                                                data):
    tmp = tmp_path_factory.mktemp("idx")
    good = _idx_file(arr, gz, tmp)
    np.testing.assert_array_equal(idx.read(tmp / ("a.idx.gz" if gz else "a.idx")), arr)
    bad = data.draw(mutated(good))
    path = tmp / "m.idx"
    path.write_bytes(bad)
    want = _idx_reference(bad)
    if want is None:
        with pytest.raises(GgoptError):
            idx.read(path)
    else:
        got = idx.read(path)
        assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("=")
        assert got.tobytes() == want.astype(got.dtype).tobytes()


@given(arr=idx_arrays(), gz=st.booleans(), data=st.data())
def test_truncated_idx_files_are_refused(tmp_path_factory, arr, gz, data):
    tmp = tmp_path_factory.mktemp("idx")
    good = _idx_file(arr, gz, tmp)
    cut = data.draw(st.integers(0, len(good) - 1))
    path = tmp / "t.idx"
    path.write_bytes(good[:cut])
    with pytest.raises(GgoptError):
        idx.read(path)


# --- GGUF ----------------------------------------------------------------------------------------

_names = st.text("abcdefghijklmnopqrstuvwxyz._0123456789", min_size=1, max_size=12)
_values = st.one_of(
    st.text(max_size=8), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False), st.lists(st.integers(-100, 100), min_size=1, max_size=4),
    st.lists(st.text(max_size=4), min_size=1, max_size=3),
)


@st.composite
def gguf_models(draw):
    metadata = {"general.architecture": draw(st.text("abcxyz-", min_size=1, max_size=8))}
    metadata.update(draw(st.dictionaries(_names.map(lambda s: "k." + s), _values, max_size=3)))
    tensors = {}
    for name in draw(st.lists(_names, min_size=1, max_size=3, unique=True)):
        dtype = draw(st.sampled_from([np.float32, np.float16, np.int32]))
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
        tensors[name] = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return metadata, tensors


def _check_loaded(metadata: dict, tensors: dict) -> None:
    """What any successful load returns: plain values and well-formed arrays."""
    for value in metadata.values():
        items = value if isinstance(value, list) else [value]
        assert all(isinstance(v, (str, bool, int, float)) for v in items)
    for arr in tensors.values():
        assert arr.dtype in (np.float32, np.float16, np.int32)
        assert 1 <= arr.ndim <= 4 and arr.flags.c_contiguous and arr.flags.writeable


@given(model=gguf_models(), data=st.data())
def test_mutated_gguf_files_load_or_raise_ggopt_errors(tmp_path_factory, model, data):
    tmp = tmp_path_factory.mktemp("gguf")
    metadata, tensors = model
    path = tmp / "m.gguf"
    ggio.save(path, tensors, metadata)
    got_meta, got_tensors = ggio.load(path)
    assert got_meta == metadata
    for name, arr in tensors.items():
        np.testing.assert_array_equal(got_tensors[name], arr)
    bad = data.draw(mutated(path.read_bytes()))
    path.write_bytes(bad)
    try:
        loaded = ggio.load(path)
    except GgoptError:
        return
    _check_loaded(*loaded)
    # what loaded is a model: written again, it reads back the same
    again = tmp / "again.gguf"
    try:
        ggio.save(again, loaded[1], loaded[0])
    except GgoptError:  # e.g. a key that a mutation turned into a reserved one
        return
    meta2, tensors2 = ggio.load(again)
    assert _same(meta2, loaded[0])
    assert list(tensors2) == list(loaded[1])
    for name, arr in loaded[1].items():
        assert tensors2[name].dtype == arr.dtype and tensors2[name].tobytes() == arr.tobytes()


def _same(a: object, b: object) -> bool:
    """Equality that takes NaN as equal to itself."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


@given(model=gguf_models(), data=st.data())
def test_truncated_gguf_files_are_refused(tmp_path_factory, model, data):
    tmp = tmp_path_factory.mktemp("gguf")
    path = tmp / "m.gguf"
    ggio.save(path, model[1], model[0])
    good = path.read_bytes()
    path.write_bytes(good[:data.draw(st.integers(0, len(good) - 1))])
    with pytest.raises(GgoptError):
        ggio.load(path)


# --- structure-aware GGUF: keys and tensor infos built from the format ------------------------

_DIMS = st.sampled_from([0, 1, 2, 4, 32, 33, 256, 1 << 31, 1 << 40, 1 << 63, (1 << 64) - 1])
_TYPES = st.sampled_from([0, 1, 2, 4, 8, 12, 14, 30, 39, 40, 999, (1 << 32) - 1])
_OFFSETS = st.sampled_from(["next", "next", 0, 32, 1 << 62, (1 << 64) - 1])


@st.composite
def gguf_structures(draw) -> bytes:
    """A GGUF whose keys and tensor infos follow the format but whose values may be absurd:
    dims beyond int64, unknown or removed types, offsets anywhere, counts that lie, names
    that are not UTF-8 or repeat, nested or oversized arrays."""
    from tests.support.gguf_bytes import gguf, kv, string, tensor_info

    kvs = [kv(b"general.architecture", 8, string(draw(st.sampled_from(
        [b"llama", b"qwen2", b"gemma3", b"\xff"]))))]
    for _ in range(draw(st.integers(0, 3))):
        item = draw(st.sampled_from([4, 8, 9]))
        n = draw(st.integers(0, 3))
        count = draw(st.sampled_from([n, n, 1 << 40, (1 << 64) - 1]))
        body = struct.pack("<IQ", 4, 0) if item == 9 else b""
        body += b"".join(struct.pack("<I", 1) if item == 4 else string(b"ab")
                         for _ in range(n))
        kvs.append(kv(draw(st.sampled_from([b"general.k", b"llama.vocab_size", b"\xfe",
                                            b"general.alignment"])), 9,
                      struct.pack("<IQ", item, count) + body))
    infos, offset = [], 0
    for i in range(draw(st.integers(0, 3))):
        ne = tuple(draw(_DIMS) for _ in range(draw(st.integers(0, 6))))
        off = draw(_OFFSETS)
        infos.append(tensor_info(draw(st.sampled_from([b"token_embd.weight", b"w%d" % i,
                                                       b"\xff\xfe"])), ne, draw(_TYPES),
                                 offset if off == "next" else off))
        offset += 64
    n_tensors = draw(st.sampled_from([len(infos), len(infos), len(infos) + 1, 1 << 40]))
    return gguf(kvs, infos, bytes(draw(st.sampled_from([0, 64, 256]))), n_tensors=n_tensors)


@given(data=gguf_structures())
def test_structured_gguf_files_load_or_raise_ggopt_errors(tmp_path_factory, data):
    from ggopt.io.gguf_header import read_header
    from ggopt.io.gguf_reader import open_gguf
    from ggopt.models import llama

    path = tmp_path_factory.mktemp("structured") / "s.gguf"
    path.write_bytes(data)
    for read in (open_gguf, ggio.load_blocks, lambda p: read_header(p, "h"),
                 lambda p: llama.load(p, progress=False)):
        try:
            read(path)
        except GgoptError as exc:
            assert str(exc)
