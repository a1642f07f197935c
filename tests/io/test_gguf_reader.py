"""ggopt.io.gguf_reader, the one bounded GGUF reader (issue 32, rows 11-12): memory linear in
the file, nesting refused, every bad count, text, shape, type and offset a GgoptError naming
the key or tensor, through every entry point that reads a GGUF."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

import ggopt.tokenizers as tk
from ggopt.errors import DTypeError, GgoptError, ShapeError
from ggopt.io import gguf as ggio
from ggopt.io.gguf_header import read_header
from ggopt.io.gguf_reader import open_gguf
from ggopt.models import llama
from tests.support.gguf_bytes import gguf, insert_key, kv, string, tensor_info
from tests.support.llama_files import write

ROOT = Path(__file__).resolve().parents[2]
CFG = llama.Config(n_ctx=32, n_embd=16, n_layer=1, n_head=2, n_head_kv=2, n_ff=32)


def _loaders() -> dict[str, object]:
    from ggopt.lm import lora

    def lora_load(p: Path) -> None:
        net = llama.load(_model(p.parent / "base.gguf"), progress=False).net
        lora.load(p, net)

    return {"llama.load": lambda p: llama.load(p, progress=False),
            "llama.load keep": lambda p: llama.load(p, base_type="keep", progress=False),
            "lora.load": lora_load, "tokenizers.load": tk.load, "io.gguf.load": ggio.load,
            "read_header": lambda p: read_header(p, "hdr")}


def _model(path: Path) -> Path:
    if not path.exists():
        write(path, CFG)
    return path


def _peak_rss_mb(path: Path) -> float:
    """Peak RSS (MB) of a fresh interpreter that loads ``path`` with ``llama.load``."""
    code = textwrap.dedent(f"""
        import json, resource, sys
        from ggopt.models import llama
        m = llama.load({str(path)!r}, progress=False)
        print(json.dumps([m.cfg.n_vocab, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    n_vocab, kb = json.loads(out.stdout.strip().splitlines()[-1])
    assert n_vocab == CFG.n_vocab
    return kb / 1024


def test_an_empty_string_array_costs_memory_linear_in_the_file(tmp_path):
    """Row 11: a model with 8 MB of empty strings in one key loaded with 1.6 GB (23 s) through
    gguf.GGUFReader; now it loads, its peak RSS over the same model without the key a small
    multiple of the key's bytes (one int64 offset per item; the map itself)."""
    base = _model(tmp_path / "base.gguf")
    count = 1_000_000  # 8 bytes per empty string
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(insert_key(base.read_bytes(), b"general.junk", 9,
                                struct.pack("<IQ", 8, count) + bytes(8 * count)))
    field = open_gguf(junk).fields["general.junk"]
    assert len(field.value) == count and field.value[-1] == b""
    extra_mb = (junk.stat().st_size - base.stat().st_size) / 2**20
    grown = _peak_rss_mb(junk) - _peak_rss_mb(base)
    assert grown < 12 * extra_mb + 16, f"{grown:.0f} MB more for {extra_mb:.0f} MB of strings"


def test_string_arrays_are_read_lazily_and_exactly(tmp_path):
    items = [b"", b"a", "caf\u00e9".encode(), b"\xff\xfe", b"x" * 300]
    path = tmp_path / "s.gguf"
    path.write_bytes(gguf([kv(b"k", 9, struct.pack("<IQ", 8, len(items)) +
                              b"".join(string(s) for s in items))]))
    value = open_gguf(path).fields["k"].value
    assert list(value) == items and value[1:3] == items[1:3] and value[-1] == items[-1]
    with pytest.raises(ShapeError, match="key 'k' item 3: expected UTF-8"):
        open_gguf(path).fields["k"].contents()


def _nested(depth: int) -> bytes:
    return gguf([kv(b"general.nested", 9, struct.pack("<IQ", 9, 1) * (depth - 1) +
                    struct.pack("<IQ", 4, 0))])


@pytest.mark.parametrize("entry", list(_loaders()))
def test_5000_nested_arrays_are_a_ggopt_error_everywhere(tmp_path, entry):
    """Row 12: no RecursionError through any entry point (llama.cpp reads no nested array)."""
    path = tmp_path / "nested.gguf"
    path.write_bytes(_nested(5000))
    with pytest.raises(GgoptError, match="general.nested"):
        _loaders()[entry](path)


@pytest.mark.parametrize("entry, key", [
    ("llama.load", "llama.rope.scaling.type"), ("tokenizers.load", "tokenizer.ggml.pre"),
    ("io.gguf.load", "general.name"), ("read_header", "general.name")])
def test_a_value_that_is_not_utf8_is_an_error_naming_the_key(tmp_path, entry, key):
    path = tmp_path / "m.gguf"
    path.write_bytes(insert_key(_model(tmp_path / "base.gguf").read_bytes(), key.encode(), 8,
                                string(b"li\xffnear")))
    with pytest.raises(GgoptError, match=key):
        _loaders()[entry](path)


@pytest.mark.parametrize("entry", list(_loaders()))
def test_a_key_that_is_not_utf8_is_a_ggopt_error(tmp_path, entry):
    path = tmp_path / "m.gguf"
    path.write_bytes(insert_key(_model(tmp_path / "base.gguf").read_bytes(), b"gen\xffal", 4,
                                struct.pack("<I", 1)))
    with pytest.raises(GgoptError, match="expected UTF-8"):
        _loaders()[entry](path)


_COUNTS = {
    "n_kv": gguf([kv(b"a", 4, bytes(4))], n_kv=(1 << 64) - 1),
    "n_tensors": gguf([kv(b"a", 4, bytes(4))], n_tensors=1 << 62),
    "string-array": gguf([kv(b"a", 9, struct.pack("<IQ", 8, 1 << 62))]),
    "f32-array": gguf([kv(b"a", 9, struct.pack("<IQ", 6, (1 << 64) - 1))]),
    "string-length": gguf([kv(b"a", 8, struct.pack("<Q", (1 << 64) - 1))]),
    "array-item-length": gguf([kv(b"a", 9, struct.pack("<IQQ", 8, 2, 0) +
                                  struct.pack("<Q", 1 << 63))]),
    "key-length": b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 60),
    "cut-in-array": gguf([kv(b"a", 9, struct.pack("<IQ", 8, 3) + string(b"xy"))]),
    "unknown-type": gguf([kv(b"a", 13, b"")]),
    "unknown-item-type": gguf([kv(b"a", 9, struct.pack("<IQ", 77, 0))]),
    "duplicate-key": gguf([kv(b"a", 4, bytes(4)), kv(b"a", 4, bytes(4))]),
    "alignment-not-u32": gguf([kv(b"general.alignment", 10, struct.pack("<Q", 64))]),
    "alignment-not-power-of-2": gguf([kv(b"general.alignment", 4, struct.pack("<I", 48))]),
}


@pytest.mark.parametrize("case", list(_COUNTS))
@pytest.mark.parametrize("entry", ["llama.load", "tokenizers.load", "io.gguf.load",
                                   "read_header"])
def test_truncated_or_oversized_counts_are_ggopt_errors(tmp_path, case, entry):
    path = tmp_path / "c.gguf"
    path.write_bytes(_COUNTS[case])
    with pytest.raises((ShapeError, DTypeError)):
        _loaders()[entry](path)


_F32 = 0
_TENSORS = {  # (ne, type, offset, data bytes)
    "five-dims": ((1, 1, 1, 1, 1), _F32, 0, 4),
    "elements-beyond-int64": ((1 << 40, 1 << 40), _F32, 0, 4),
    "dim-beyond-int64": ((1 << 63,), _F32, 0, 4),
    "data-beyond-file": ((1 << 30, 1 << 20), _F32, 0, 64),
    "offset-beyond-file": ((4,), _F32, 1 << 62, 64),
    "offset-not-contiguous": ((4,), _F32, 32, 64),
    "unknown-type": ((4,), 999, 0, 64),
    "removed-type": ((4,), 4, 0, 64),  # Q4_2, gone from ggml
    "ne0-not-whole-blocks": ((33,), 8, 0, 64),  # Q8_0 has 32-element blocks
}


@pytest.mark.parametrize("case", list(_TENSORS))
@pytest.mark.parametrize("entry", ["llama.load", "io.gguf.load", "read_header"])
def test_absurd_tensor_dims_types_and_offsets_are_ggopt_errors(tmp_path, case, entry):
    ne, qtype, offset, size = _TENSORS[case]
    path = tmp_path / "t.gguf"
    path.write_bytes(gguf([kv(b"general.architecture", 8, string(b"llama"))],
                          [tensor_info(b"token_embd.weight", ne, qtype, offset)], bytes(size)))
    with pytest.raises((ShapeError, DTypeError), match="token_embd.weight"):
        _loaders()[entry](path)


def test_the_reader_agrees_with_gguf_reader_on_a_model(tmp_path):
    """Keys (strings as bytes, arrays), tensor names, ggml shapes, types, offsets and data the
    same as gguf.GGUFReader's, in either byte order."""
    for big in (False, True):
        path = tmp_path / f"m{big}.gguf"
        write(path, CFG, big_endian=big)
        ours, ref = open_gguf(path), GGUFReader(path)
        assert ours.byte_order == ref.byte_order and ours.data_offset == ref.data_offset
        want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert {k: f.contents() for k, f in ours.fields.items()} == want
        assert [(t.name, t.shape, t.tensor_type, t.data_offset, t.n_bytes) for t in ours.tensors] \
            == [(t.name, tuple(int(d) for d in t.shape), t.tensor_type, t.data_offset,
                 t.n_bytes) for t in ref.tensors]
        for a, b in zip(ours.tensors, ref.tensors):
            assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
            np.testing.assert_array_equal(a.data, b.data)
            assert not a.data.flags.writeable
