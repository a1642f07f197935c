"""ggopt.io.gguf: save/load round trips, ggml shapes in the file, validation of bad input."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from ggopt import (
    DTypeError,
    InvalidValueError,
    ShapeError,
)
from ggopt.io import gguf as ggio
from ggopt.quants import Blocks
from ggopt.types import GGType
from tools.kquants import k_blocks

ARCH = {"general.architecture": "mnist-fc"}
SHAPES = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 5)]
GGML_TYPES = {
    np.float32: gguf.GGMLQuantizationType.F32,
    np.float16: gguf.GGMLQuantizationType.F16,
    np.int32: gguf.GGMLQuantizationType.I32,
}


def _sample(dtype: type, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype is np.int32:
        return rng.integers(-(2**31), 2**31, size=shape, dtype=np.int32)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(GGML_TYPES))
def test_tensor_round_trip_and_ggml_shapes(tmp_path: Path, dtype: type,
                                           shape: tuple[int, ...]) -> None:
    a = _sample(dtype, shape)
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": a}, ARCH)
    metadata, tensors = ggio.load(path)
    assert metadata == ARCH
    b = tensors["w"]
    assert b.shape == shape and b.dtype == np.dtype(dtype)
    assert b.flags.writeable and b.flags.c_contiguous and b.flags.owndata
    np.testing.assert_array_equal(a, b)
    (info,) = gguf.GGUFReader(path).tensors
    assert info.shape.tolist() == list(reversed(shape))  # ggml order: ne0 first
    assert info.tensor_type == GGML_TYPES[dtype]


def test_several_tensors_keep_names_order_and_data(tmp_path: Path) -> None:
    tensors = {
        "fc1.weight": _sample(np.float32, (500, 784), 1),
        "fc1.bias": _sample(np.float32, (500,), 2),
        "emb": _sample(np.float16, (3, 33), 3),
        "ids": _sample(np.int32, (10, 1), 4),
    }
    ggio.save(tmp_path / "m.gguf", tensors, ARCH)
    _, out = ggio.load(tmp_path / "m.gguf")
    assert list(out) == list(tensors)
    for name, a in tensors.items():
        np.testing.assert_array_equal(out[name], a)
    ne = {t.name: t.shape.tolist() for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    assert ne == {"fc1.weight": [784, 500], "fc1.bias": [500], "emb": [33, 3], "ids": [1, 10]}


def test_save_accepts_views_and_non_native_byte_order(tmp_path: Path) -> None:
    a = np.arange(24, dtype=">f4").reshape(4, 6)[:, ::2]
    ggio.save(tmp_path / "m.gguf", {"v": a}, ARCH)
    np.testing.assert_array_equal(ggio.load(tmp_path / "m.gguf")[1]["v"], a)


def test_no_tensors(tmp_path: Path) -> None:
    ggio.save(tmp_path / "m.gguf", {}, ARCH)
    assert ggio.load(tmp_path / "m.gguf") == (ARCH, {})


METADATA = {
    "general.architecture": "mnist-cnn",
    "general.name": "",
    "mnist.n_hidden": 500,
    "mnist.big": 2**40,
    "mnist.neg": -7,
    "opt.alpha": 0.001,
    "opt.eps32": np.float32(1e-8),
    "opt.use_wd": True,
    "opt.off": False,
    "labels": ["zero", "", "two"],
    "sizes": [784, 500, 10],
    "mixed_range": [1, 2**33],
    "floats": [0.1, -2.5],
    "flags": [True, False, True],
    "np_int": np.int64(12),
}
FILE_TYPES = {
    "general.architecture": ["STRING"], "general.name": ["STRING"],
    "mnist.n_hidden": ["INT32"], "mnist.big": ["INT64"], "mnist.neg": ["INT32"],
    "opt.alpha": ["FLOAT64"], "opt.eps32": ["FLOAT32"], "opt.use_wd": ["BOOL"],
    "opt.off": ["BOOL"], "labels": ["ARRAY", "STRING"], "sizes": ["ARRAY", "INT32"],
    "mixed_range": ["ARRAY", "INT64"], "floats": ["ARRAY", "FLOAT64"],
    "flags": ["ARRAY", "BOOL"], "np_int": ["INT32"],
}


def test_metadata_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, METADATA)
    metadata, _ = ggio.load(path)
    assert metadata == METADATA
    assert list(metadata) == list(METADATA)
    assert type(metadata["opt.use_wd"]) is bool and type(metadata["np_int"]) is int
    assert not any(key.startswith("GGUF.") for key in metadata)
    fields = gguf.GGUFReader(path).fields
    assert {k: [t.name for t in f.types] for k, f in fields.items()
            if not k.startswith("GGUF.")} == FILE_TYPES


def test_architecture_field_is_the_writer_arch(tmp_path: Path) -> None:
    ggio.save(tmp_path / "m.gguf", {}, {"x": 1, "general.architecture": "llama"})
    field = gguf.GGUFReader(tmp_path / "m.gguf").fields["general.architecture"]
    assert field.contents() == "llama"


@pytest.mark.parametrize("tensors, metadata, error, pattern", [
    ({}, {}, InvalidValueError, "general.architecture"),
    ({}, {"general.architecture": ""}, InvalidValueError, "general.architecture"),
    ({}, {"general.architecture": 3}, InvalidValueError, "general.architecture"),
    ({}, {**ARCH, "GGUF.version": 2}, InvalidValueError, "reserved"),
    ({}, {**ARCH, "general.alignment": 64}, InvalidValueError, "reserved"),
    ({}, {**ARCH, "": 1}, InvalidValueError, "non-empty str key"),
    ({}, {**ARCH, "l": []}, InvalidValueError, "non-empty list"),
    ({}, {**ARCH, "l": [1, "a"]}, DTypeError, "one kind per list"),
    ({}, {**ARCH, "l": [[1], [2]]}, DTypeError, "one kind per list"),
    ({}, {**ARCH, "d": {"a": 1}}, DTypeError, "expected str, bool, int"),
    ({}, {**ARCH, "n": None}, DTypeError, "expected str, bool, int"),
    ({}, {**ARCH, "i": 2**63}, DTypeError, "int within int64"),
    ({"w": np.zeros(3)}, ARCH, DTypeError, "float32, float16 or int32, got float64"),
    ({"w": np.zeros(3, np.int64)}, ARCH, DTypeError, "got int64"),
    ({"w": np.float32(1)}, ARCH, ShapeError, "1..4 dimensions"),
    ({"w": np.zeros((1,) * 5, np.float32)}, ARCH, ShapeError, "1..4 dimensions"),
    ({"x" * 64: np.zeros(3, np.float32)}, ARCH, InvalidValueError, "at most 63"),
    ({"": np.zeros(3, np.float32)}, ARCH, InvalidValueError, "tensor name"),
])
def test_save_rejects_bad_input_before_writing(tmp_path: Path, tensors: dict,
                                               metadata: dict, error: type,
                                               pattern: str) -> None:
    path = tmp_path / "m.gguf"
    with pytest.raises(error, match=pattern):
        ggio.save(path, tensors, metadata)
    assert not path.exists()


def _reference_file(path: Path, with_tensors: bool = True) -> bytes:
    tensors = {"a": _sample(np.float32, (3, 5)), "b": _sample(np.int32, (2,))}
    metadata = {**ARCH, "n": 3, "l": ["x", "yz"], "s": "a string that ends the KV section"}
    ggio.save(path, tensors if with_tensors else {}, metadata)
    return path.read_bytes()


# Without tensors the file ends with the last KV string: a cut inside it at an aligned
# offset is what the plain GGUFReader lets through.
@pytest.mark.parametrize("with_tensors", [True, False], ids=["tensors", "kv-only"])
def test_every_truncation_raises_shape_error(tmp_path: Path, with_tensors: bool) -> None:
    data = _reference_file(tmp_path / "ref.gguf", with_tensors)
    cut = tmp_path / "cut.gguf"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(ShapeError, match="gguf_init_from_file"):
            ggio.load(cut)


def test_truncated_trailing_padding(tmp_path: Path) -> None:
    data = _reference_file(tmp_path / "ref.gguf")
    assert len(data) % 32 == 0  # the last tensor (8 bytes) is padded to the alignment
    (tmp_path / "cut.gguf").write_bytes(data[:-4])
    with pytest.raises(ShapeError, match="data section"):
        ggio.load(tmp_path / "cut.gguf")


@pytest.mark.parametrize("content", [
    b"", b"GGUF", b"\x00" * 64, np.random.default_rng(5).bytes(4096),
    b"GGUF" + np.random.default_rng(6).bytes(4092),
], ids=["empty", "magic-only", "zeros", "random", "magic-then-random"])
def test_non_gguf_files_raise_shape_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "x.gguf").write_bytes(content)
    with pytest.raises(ShapeError, match="x.gguf"):
        ggio.load(tmp_path / "x.gguf")


def test_corrupted_bytes_never_escape_as_other_errors(tmp_path: Path) -> None:
    """300 single-byte changes in the header, KV and tensor-info region: each file is either
    rejected with ShapeError/DTypeError, or read faithfully: the same tensor data in the same
    order, and at most one name or metadata entry different (the changed byte was inside a
    string or a value). A change to the magic is always rejected."""
    data = _reference_file(tmp_path / "ref.gguf")
    meta_ref, tensors_ref = ggio.load(tmp_path / "ref.gguf")
    rng = np.random.default_rng(7)
    bad = tmp_path / "bad.gguf"
    rejected = accepted = 0
    for _ in range(300):
        b = bytearray(data)
        pos = int(rng.integers(0, 200))
        b[pos] = (data[pos] + int(rng.integers(1, 256))) % 256  # always a different byte
        bad.write_bytes(bytes(b))
        try:
            meta, tensors = ggio.load(bad)
        except (ShapeError, DTypeError):
            rejected += 1
            continue
        accepted += 1
        assert pos >= 4, f"a changed magic byte at {pos} was accepted"
        assert len(tensors) == len(tensors_ref) and len(meta) == len(meta_ref), pos
        for got, want in zip(tensors.values(), tensors_ref.values()):
            assert got.dtype == want.dtype and got.shape == want.shape, pos
            np.testing.assert_array_equal(got, want, err_msg=f"byte {pos}")
        changed = sum(a != c for a, c in zip(tensors, tensors_ref))
        changed += sum(a != c for a, c in zip(meta.items(), meta_ref.items()))
        assert changed <= 1, f"byte {pos}: {changed} names or entries changed"
    assert rejected + accepted == 300 and rejected > 0


def test_unsupported_tensor_type_is_dtype_error(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "f64.gguf", "test")
    writer.add_tensor("d", np.zeros(4, np.float64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(DTypeError, match="expected F32, F16 or I32, got F64"):
        ggio.load(tmp_path / "f64.gguf")


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ggio.load(tmp_path / "absent.gguf")


def _leftovers(d: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


@pytest.mark.parametrize("metadata", [{"k": "\ud800"}, {"\udcff": 1}, {"k": ["a", "\ud800"]}])
def test_gguf_save_refuses_unencodable_text_and_keeps_the_file(tmp_path, metadata):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    before = path.read_bytes()
    with pytest.raises(InvalidValueError, match="UTF-8"):
        ggio.save(path, {"w": np.zeros(3, np.float32)},
                  {"general.architecture": "x", **metadata})
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"m.gguf"}) == []


def test_gguf_save_refuses_unencodable_names(tmp_path):
    path = tmp_path / "m.gguf"
    with pytest.raises(InvalidValueError):
        ggio.save(path, {"\ud800": np.ones(3, np.float32)}, {"general.architecture": "x"})
    with pytest.raises(InvalidValueError, match="UTF-8"):
        ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "\ud800"})
    assert not path.exists()


def test_gguf_save_failing_mid_write_keeps_the_file(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    ggio.save(path, {"w": np.ones(3, np.float32)}, {"general.architecture": "x"})
    before = path.read_bytes()

    def boom(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ggio.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(OSError, match="disk full"):
        ggio.save(path, {"w": np.zeros(5, np.float32)}, {"general.architecture": "y"})
    assert path.read_bytes() == before
    assert _leftovers(tmp_path, {"m.gguf"}) == []


_STRING, _ARRAY, _UINT8 = 8, 9, 0


def _gstr(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _gguf_with_kv(key: bytes, vtype: int, payload: bytes) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    arch = _gstr(b"general.architecture") + struct.pack("<I", _STRING) + _gstr(b"x")
    return head + arch + _gstr(key) + struct.pack("<I", vtype) + payload


def test_gguf_nested_array_with_an_empty_first_item_is_refused(tmp_path):
    # [[], ["zz"]]: an array of 2 arrays, the first empty (of uint8), the second one string
    inner_empty = struct.pack("<IQ", _UINT8, 0)
    inner_str = struct.pack("<IQ", _STRING, 1) + _gstr(b"zz")
    payload = struct.pack("<IQ", _ARRAY, 2) + inner_empty + inner_str
    path = tmp_path / "nested.gguf"
    path.write_bytes(_gguf_with_kv(b"k", _ARRAY, payload))
    with pytest.raises(DTypeError, match="nested"):
        ggio.load(path)


def test_gguf_deeply_nested_arrays_are_refused(tmp_path):
    depth = 3000
    payload = struct.pack("<IQ", _ARRAY, 1) * depth + struct.pack("<IQ", _UINT8, 0)
    path = tmp_path / "deep.gguf"
    path.write_bytes(_gguf_with_kv(b"k", _ARRAY, payload))
    with pytest.raises(DTypeError, match="nested"):
        ggio.load(path)


def test_k_quant_blocks_load_as_written_and_save_byte_for_byte(tmp_path: Path) -> None:
    """Q4_K / Q5_K / Q6_K tensors written by the gguf package's writer come back as their raw
    super-blocks, and ggopt's save writes the same file again; any cut in their data is a
    ShapeError."""
    raws = {"q4k": (GGType.Q4_K, k_blocks(GGType.Q4_K, 3, 512, seed=1)),
            "q5k": (GGType.Q5_K, k_blocks(GGType.Q5_K, 2, 768, seed=3)),
            "q6k": (GGType.Q6_K, k_blocks(GGType.Q6_K, 2, 256, seed=2))}
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(path, "test")
    for name, (qtype, raw) in raws.items():
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(int(qtype)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta, tensors = ggio.load_blocks(path)
    for name, (qtype, raw) in raws.items():
        got = tensors[name]
        assert isinstance(got, Blocks) and got.type is qtype
        assert got.shape == (raw.shape[0], raw.shape[1] // qtype.size * 256)
        np.testing.assert_array_equal(got.data, raw)
    again = tmp_path / "again.gguf"
    ggio.save(again, tensors, meta)
    assert again.read_bytes() == path.read_bytes()
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in range(len(data) - 2 * 210, len(data), 37):  # inside the last tensor's blocks
        cut.write_bytes(data[:n])
        with pytest.raises(ShapeError, match="gguf_init_from_file"):
            ggio.load_blocks(cut)
