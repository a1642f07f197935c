"""Tokenizer throughput (MB of text per second) for SmolLM2's BPE and Llama's SentencePiece.

Texts: ``/usr/share/common-licenses/GPL-3`` (35 KB of English) and a larger one, the first 60
modules of the running Python's standard library (about 1.7 MB of code). ``cold`` rows clear
the tokenizer's word cache before every call (every distinct word merged anew, what one call
on fresh text costs); ``warm`` rows keep it (text like the text seen before). Each row stores
its MB/s and the issue's goal (1 MB/s) in ``extra_info``. The tokenizer works on one thread.
Vocabularies come from ``$GGOPT_CACHE`` (default ``~/.cache/ggopt``); rows skip without them.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import pytest

import ggopt.tokenizers as tk

CACHE = Path(os.environ.get("GGOPT_CACHE", Path.home() / ".cache/ggopt"))
VOCABS = {"smollm2": CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "llama-spm": CACHE / "llama.cpp-models/ggml-vocab-llama-spm.gguf"}
GOAL_MB_S = 1.0


def _texts() -> dict[str, bytes]:
    gpl = Path("/usr/share/common-licenses/GPL-3")
    out = {"gpl3": gpl.read_bytes()} if gpl.exists() else {}
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:60]
    out["stdlib"] = b"".join(Path(f).read_bytes() for f in files)
    return out


TEXTS = _texts()
_LOADED: dict[str, tk.Tokenizer] = {}


def _tokenizer(name: str) -> tk.Tokenizer:
    if name not in _LOADED:
        if not VOCABS[name].exists():
            pytest.skip(f"{VOCABS[name]} missing")
        _LOADED[name] = tk.load(VOCABS[name])
    return _LOADED[name]


def _clear(tok: tk.Tokenizer) -> None:
    for model in (tok._bpe, tok._spm):
        if model is not None:
            model._cache.clear()


@pytest.mark.parametrize("cache", ["cold", "warm"])
@pytest.mark.parametrize("text", sorted(TEXTS))
@pytest.mark.parametrize("vocab", sorted(VOCABS))
def test_encode_mb_per_s(benchmark, vocab, text, cache):
    tok = _tokenizer(vocab)
    data = TEXTS[text]
    benchmark.group = f"tokenizer-{vocab}"
    setup = (lambda: _clear(tok)) if cache == "cold" else None
    tok.encode(data)
    if setup is None:
        ids = benchmark(tok.encode, data)
    else:
        ids = benchmark.pedantic(tok.encode, (data,), setup=setup, rounds=5)
    expected = (b" " + data) if tok.model == "llama" else data
    assert tok.decode(ids[1:] if tok.add_bos else ids) == expected
    if benchmark.stats is not None:
        mb_s = len(data) / benchmark.stats.stats.median / 1e6
        benchmark.extra_info["MB_per_s"] = round(mb_s, 2)
        benchmark.extra_info["goal_MB_per_s"] = GOAL_MB_S
        benchmark.extra_info["met"] = bool(mb_s >= GOAL_MB_S)


@pytest.mark.parametrize("vocab", sorted(VOCABS))
def test_load_seconds(benchmark, vocab):
    if not VOCABS[vocab].exists():
        pytest.skip(f"{VOCABS[vocab]} missing")
    benchmark.group = "tokenizer-load"
    tok = benchmark.pedantic(tk.load, (VOCABS[vocab],), rounds=3)
    assert tok.n_vocab > 1000
