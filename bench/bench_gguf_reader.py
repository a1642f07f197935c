"""Reading a GGUF's keys and tensor table: ggopt's bounded reader (``ggopt.io.gguf_reader``)
against ``gguf.GGUFReader`` in the same run, on SmolLM2 (49k tokens, 48k merges; skipped
without the model in ``GGOPT_CACHE``) and on a header of 2^17 empty strings (issue 32, row 11:
``GGUFReader`` makes NumPy arrays per item)."""

from __future__ import annotations

import struct

import pytest
from gguf import GGUFReader

from ggopt.io.gguf_reader import open_gguf
from tools.smollm import q4_1_path

_READERS = {"gguf_reader": GGUFReader, "ggopt": open_gguf}


@pytest.mark.benchmark(group="read SmolLM2 Q4_1's keys and tensor table")
@pytest.mark.parametrize("impl", list(_READERS))
def test_read_smollm2(benchmark, ratio_to, impl):
    path = q4_1_path()
    if not path.exists():
        pytest.skip("SmolLM2 not in GGOPT_CACHE (tools/fetch_models.py)")
    reader = benchmark.pedantic(lambda: _READERS[impl](path), rounds=3)
    assert len(reader.tensors) == 272  # type: ignore[attr-defined]
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 49152  # type: ignore[attr-defined]
    ratio_to(impl, gguf_reader=None)


@pytest.mark.benchmark(group="read a header of 2^17 empty strings")
@pytest.mark.parametrize("impl", list(_READERS))
def test_read_empty_strings(benchmark, ratio_to, impl, tmp_path_factory):
    path = tmp_path_factory.mktemp("strings") / "s.gguf"
    n = 1 << 17
    key = b"general.junk"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IIQ", 9, 8, n) + bytes(8 * n))
    reader = benchmark.pedantic(lambda: _READERS[impl](path), rounds=3)
    assert len(reader.fields["general.junk"].contents()) == n  # type: ignore[attr-defined]
    ratio_to(impl, gguf_reader=None)
