"""ggopt.tokenizers against a real llama.cpp (``llama-cpp-python``, vocabulary only).

Skipped unless ``GGOPT_INTEROP=1``: ``GGOPT_INTEROP=1 python -m pytest -m interop
tests/tokenizers/test_interop.py``. ``Llama.tokenize(text, add_bos, special)`` is
``llama_tokenize(add_special, parse_special)``.
"""

from __future__ import annotations

import os

import pytest

import ggopt.tokenizers as tk
from tests.support.tokenizer_files import smollm2_path, vocab_path

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]

TEXTS = [b"Hello world", b" Hello World!\n\n12345 apples", b"  \t\n\n2 x\n\n3",
         b"I'm can't we'LL", "café naïve 日本語 😀".encode(), b"a\xff\xc3(", b"",
         b"<|im_start|>user\nHi<|im_end|>\n", b"<s>x</s> y <|end|>  z"]


@pytest.mark.parametrize("name", ["smollm2", "llama-spm", "llama-bpe", "qwen2", "phi-3"])
def test_ids_equal_llama_cpp(name):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = smollm2_path() if name == "smollm2" else vocab_path(name)
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = tk.load(path)
    with open("/usr/share/common-licenses/GPL-3", "rb") as fh:
        texts = TEXTS + [fh.read()]
    for text in texts:
        for add_special in (False, True):
            for parse_special in (False, True):
                assert tok.encode(text, add_special=add_special, parse_special=parse_special) \
                    == ref.tokenize(text, add_bos=add_special, special=parse_special), text[:40]
