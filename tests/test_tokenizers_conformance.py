"""llama.cpp's own tokenizer tests: ``models/ggml-vocab-*.gguf`` with their ``.inp``/``.out``.

``test-tokenizer-0`` tokenizes each input with ``add_special = false`` and
``parse_special = false``; ggopt must give exactly the ids of the ``.out`` line. A vocabulary
whose model or pre-tokenizer ggopt does not implement must be refused, naming it.
"""

from __future__ import annotations

import functools

import pytest
from tokenizer_files import conformance_cases, vocab_path

import ggopt.tokenizers as tk
from ggopt.errors import GgoptError
from ggopt.tokenizers.pretokenize import PRE_TOKENIZERS, PreTokenizer

IMPLEMENTED = ["gpt-2", "llama-bpe", "llama-spm", "qwen2", "phi-3", "mpt", "starcoder",
               "refact", "command-r", "deepseek-llm", "deepseek-coder", "falcon"]
# vocabulary -> what the refusal must name
load = functools.cache(tk.load)
REFUSED = {"aquila": "tokenizer.ggml.pre", "gpt-neox": "tokenizer.ggml.pre",
           "qwen35": "'qwen35'", "bert-bge": "'bert'", "gemma-4": "'gemma4'",
           "nomic-bert-moe": "'t5'"}


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_vocab_matches_llama_cpp(name):
    path = vocab_path(name)
    tok = load(path)
    cases = conformance_cases(path)
    assert len(cases) >= 40
    got = [tok.encode(text, add_special=False, parse_special=False) for text, _ in cases]
    bad = [(text, g, ids) for (text, ids), g in zip(cases, got) if g != ids]
    assert not bad, f"{len(bad)} of {len(cases)} differ, first: {bad[0]}"


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_vocab_decodes_back(name):
    """The conformance texts are valid UTF-8: their ids decode back to the very bytes,
    except where llama.cpp's SentencePiece adds its leading space."""
    path = vocab_path(name)
    tok = load(path)
    for text, ids in conformance_cases(path):
        got = tok.decode(ids)
        if tok.model == "llama":
            assert got == b" " + text if text else got == b""
        else:
            assert got == text


@pytest.mark.parametrize("name", list(REFUSED))
def test_unimplemented_vocab_is_refused_by_name(name):
    with pytest.raises(GgoptError, match=REFUSED[name]):
        tk.load(vocab_path(name))


@pytest.mark.parametrize("pre", sorted({"gpt-2", "smollm", "llama-bpe", "qwen2"}))
def test_c_scanner_equals_the_regexes(pre):
    """The C pre-tokenizer cuts the conformance texts, and harder ones, as the regexes do."""
    assert PRE_TOKENIZERS[pre].scan is not None
    splitter = PreTokenizer(pre)
    texts = [t.decode() for t, _ in conformance_cases(vocab_path("gpt-2"))]
    texts += ["'S 'Ll 'rE x'  \n\n  \r\n\t 12345 ?!\n\n\n", " ", "  ", "\n", "a  ", "١٢٣ ½x",
              "e\u0301 \u00a0\u2003x\u3000\u3000y", "\u0085\u0085a", " 'll", "'", "''s",
              "😀😀 a😀", "\ud800x", "x\r\r\n\r y", "  !!\n\n x ", "abc123def4567"]
    for text in texts:
        assert splitter.split(text) == splitter.split_regex(text), repr(text)
