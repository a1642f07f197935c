"""ggopt.io.idx: IDX round trips, header validation, real MNIST and the bundled subset."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from ggopt import (
    DTypeError,
    ShapeError,
)
from ggopt.io import idx

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / ".." / "shared" / "data" / "mnist"
SUBSET = ROOT / "ggopt" / "models" / "mnist" / "subset"
TYPE_CODES = {
    np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C,
    np.float32: 0x0D, np.float64: 0x0E,
}
SHAPES = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)]

needs_mnist = pytest.mark.skipif(
    not (MNIST / "t10k-labels-idx1-ubyte.gz").exists(),
    reason=f"real MNIST not found at {MNIST}",
)


def _sample(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    if info is None:
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def _idx_bytes(code: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, code, len(dims)]) + np.asarray(dims, ">u4").tobytes() + payload


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(TYPE_CODES))
def test_round_trip(tmp_path: Path, dtype: type, shape: tuple[int, ...], suffix: str) -> None:
    a = _sample(dtype, shape)
    path = tmp_path / f"a.idx{suffix}"
    idx.write(path, a)
    raw = path.read_bytes()
    header = gzip.decompress(raw)[:4] if suffix else raw[:4]
    assert header == bytes([0, 0, TYPE_CODES[dtype], len(shape)])
    assert (raw[:2] == b"\x1f\x8b") == bool(suffix)
    b = idx.read(path)
    assert b.shape == shape and b.dtype == np.dtype(dtype)
    assert b.dtype.isnative and b.flags.writeable and b.flags.c_contiguous
    np.testing.assert_array_equal(a, b)


def test_payload_is_big_endian(tmp_path: Path) -> None:
    path = tmp_path / "a.idx"
    idx.write(path, np.array([1, -2], dtype=np.int32))
    assert path.read_bytes() == _idx_bytes(0x0C, (2,), b"\x00\x00\x00\x01\xff\xff\xff\xfe")


def test_write_accepts_non_native_and_non_contiguous(tmp_path: Path) -> None:
    a = np.arange(24, dtype=">f8").reshape(4, 6)[:, ::2]
    idx.write(tmp_path / "a.idx", a)
    np.testing.assert_array_equal(idx.read(tmp_path / "a.idx"), a)


def test_gzip_detected_by_magic_not_suffix(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    idx.write(tmp_path / "z.gz", a)
    (tmp_path / "z.gz").rename(tmp_path / "compressed.idx")
    idx.write(tmp_path / "raw.idx", a)
    (tmp_path / "raw.idx").rename(tmp_path / "raw.gz")
    np.testing.assert_array_equal(idx.read(tmp_path / "compressed.idx"), a)
    np.testing.assert_array_equal(idx.read(tmp_path / "raw.gz"), a)


def test_gzip_output_is_reproducible(tmp_path: Path) -> None:
    a = np.arange(100, dtype=np.int16)
    idx.write(tmp_path / "a.gz", a)
    first = (tmp_path / "a.gz").read_bytes()
    idx.write(tmp_path / "a.gz", a)
    assert (tmp_path / "a.gz").read_bytes() == first


def test_zero_sized_dimension(tmp_path: Path) -> None:
    idx.write(tmp_path / "e.idx", np.zeros((0, 28, 28), np.uint8))
    assert idx.read(tmp_path / "e.idx").shape == (0, 28, 28)


GOOD_PAYLOAD = np.arange(6, dtype=">i2").tobytes()
BAD_FILES = {
    "truncated payload": (_idx_bytes(0x0B, (2, 3), GOOD_PAYLOAD[:-1]),
                          r"payload: expected 12 bytes .*got 11 bytes"),
    "extra bytes": (_idx_bytes(0x0B, (2, 3), GOOD_PAYLOAD + b"\0\0\0"),
                    r"payload: expected 12 bytes .*got 15 bytes"),
    "bad magic": (b"\x00\x01" + _idx_bytes(0x0B, (2, 3), GOOD_PAYLOAD)[2:],
                  r"magic bytes 0-1: expected 00 00, got 00 01"),
    "bad type code": (_idx_bytes(0x07, (2, 3), GOOD_PAYLOAD), r"type code 0x07"),
    "zero dims": (bytes([0, 0, 0x08, 0]), r"dimension count: expected >= 1, got 0"),
    "short header": (b"\x00\x00", r"header: expected 4 bytes, got 2"),
    "short sizes": (bytes([0, 0, 0x08, 3]) + b"\x00\x00\x00\x02",
                    r"dimension sizes: expected 12 bytes for 3 sizes, got 4 bytes"),
    "huge sizes": (_idx_bytes(0x0E, (0xFFFFFFFF, 0xFFFFFFFF), b"\0" * 8),
                   rf"payload: expected {8 * 0xFFFFFFFF**2} bytes .*got 8 bytes"),
}


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_malformed_file_raises_naming_field(tmp_path: Path, case: str, gz: bool) -> None:
    content, pattern = BAD_FILES[case]
    path = tmp_path / "bad.idx"
    path.write_bytes(gzip.compress(content) if gz else content)
    with pytest.raises(ShapeError, match=pattern) as info:
        idx.read(path)
    assert "bad.idx" in str(info.value)


@pytest.mark.parametrize("cut", ["corrupt", "truncated"])
def test_bad_gzip_stream(tmp_path: Path, cut: str) -> None:
    good = gzip.compress(_idx_bytes(0x08, (1000,), bytes(range(250)) * 4))
    if cut == "truncated":
        bad = good[: len(good) // 2]
    else:
        bad = good[:10] + bytes(b ^ 0x5A for b in good[10:-8]) + good[-8:]
    (tmp_path / "bad.gz").write_bytes(bad)
    with pytest.raises(ShapeError, match="gzip stream"):
        idx.read(tmp_path / "bad.gz")


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        idx.read(tmp_path / "absent.idx")


@pytest.mark.parametrize("array, error", [
    (np.zeros(3, np.int64), DTypeError),
    (np.zeros(3, bool), DTypeError),
    (np.zeros(3, np.float16), DTypeError),
    (np.float32(1.0), ShapeError),
])
def test_write_rejects_without_creating_file(tmp_path: Path, array: np.ndarray,
                                             error: type) -> None:
    with pytest.raises(error):
        idx.write(tmp_path / "x.idx", array)
    assert not (tmp_path / "x.idx").exists()


@needs_mnist
def test_real_mnist_t10k() -> None:
    labels = idx.read(MNIST / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    counts = np.bincount(labels, minlength=10)
    assert counts.sum() == 10000 and len(counts) == 10
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    images = idx.read(MNIST / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert images.max() == 255 and images.min() == 0


SUBSET_FILES = {
    "train-images-idx3-ubyte.gz": (4000, 28, 28),
    "train-labels-idx1-ubyte.gz": (4000,),
    "t10k-images-idx3-ubyte.gz": (1000, 28, 28),
    "t10k-labels-idx1-ubyte.gz": (1000,),
}


@pytest.mark.parametrize("name", list(SUBSET_FILES))
def test_bundled_subset_shapes(name: str) -> None:
    data = idx.read(SUBSET / name)
    assert data.shape == SUBSET_FILES[name] and data.dtype == np.uint8
    if "labels" in name:
        assert data.max() == 9 and len(np.unique(data)) == 10


def test_bundled_subset_is_small() -> None:
    assert sum((SUBSET / name).stat().st_size for name in SUBSET_FILES) < 5 * 2**20


@needs_mnist
@pytest.mark.parametrize("name", list(SUBSET_FILES))
def test_bundled_subset_is_prefix_of_mnist(name: str) -> None:
    sub = idx.read(SUBSET / name)
    np.testing.assert_array_equal(sub, idx.read(MNIST / name)[: len(sub)])


def _leftovers(d: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_idx_write_failing_mid_write_keeps_the_file(tmp_path, monkeypatch, name):
    path = tmp_path / name
    idx.write(path, np.arange(6, dtype=np.uint8).reshape(2, 3))
    before = path.read_bytes()

    def failing(out, header, payload):
        out.write(header)
        raise OSError("disk full")

    monkeypatch.setattr(idx, "_write_stream", failing)
    with pytest.raises(OSError, match="disk full"):
        idx.write(path, np.zeros((4, 4), dtype=np.uint8))
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {name}) == []


def _uint8_idx_bytes(dims: list[int], payload: bytes = b"") -> bytes:
    return bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


@pytest.mark.parametrize("dims, payload", [
    ([1] * 65, b"\x07"),
    ([1] * 255, b"\x07"),
    ([0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b""),
])
def test_idx_headers_numpy_cannot_represent(tmp_path, dims, payload):
    path = tmp_path / "x.idx"
    path.write_bytes(_uint8_idx_bytes(dims, payload))
    with pytest.raises(ShapeError, match="dimension"):
        idx.read(path)


def test_idx_64_dims_and_empty_shapes_still_load(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(_uint8_idx_bytes([1] * 64, b"\x07"))
    assert idx.read(path).shape == (1,) * 64
    path.write_bytes(_uint8_idx_bytes([0, 5]))
    assert idx.read(path).shape == (0, 5)
