"""Gemma 3 270M (Q4_K_M as shipped; ``tools/fetch_models.py gemma3``) in ggopt and in a live
llama.cpp (llama-cpp-python; F32 KV cache, flash attention off): the gemma3 reference model, as
SmolLM2 is llama's (issue 31). Markers ``interop`` and ``model``, skipped unless
``GGOPT_INTEROP=1`` and the file is cached: ``GGOPT_INTEROP=1 python -m pytest -m interop
tests/models/test_gemma3_interop.py -s`` (``-s`` shows the measured numbers).

Its SPM tokenizer (Gemma's specials, no space prefix) gives llama.cpp's ids for GPL-3; on the
F32 copy the logits agree to 1e-3 of their largest magnitude over 128 tokens (llama.cpp's GELU
reads a float16 table: the rest of the difference) and greedy generation of 32 tokens is
identical; on the Q4_K_M file as shipped llama.cpp rounds the activations to 8 bits for its
quantized products; perplexity of GPL-3 at ctx 256 (12 windows) within 0.5 %.
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
    q4 = shipped_path("gemma3")
    cpp = llama_cpp_model(f32_path("gemma3"), 256)
    ids = cpp.tokenize(GPL3.read_bytes(), add_bos=True, special=False)
    return load(q4, progress=False), cpp, ids


def test_tokenizer_equals_llama_cpp(setup):
    model, cpp, ids = setup
    tok = model.require_tokenizer()
    assert tok.encode(GPL3.read_text()) == ids
    text = "<start_of_turn>user\nÜber  naïve 東京 🤖\t tabs\n\n<end_of_turn>"
    want = cpp.tokenize(text.encode(), add_bos=False, special=True)
    assert tok.encode(text, add_special=False, parse_special=True) == want


def test_logits_and_greedy_equal_llama_cpp_on_the_f32_copy(setup):
    model, cpp, ids = setup
    prompt = ids[:128]
    ours, theirs = logits(model, prompt), llama_cpp_logits(cpp, prompt)
    rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    print(f"\nF32 copy: largest logit difference over 128 tokens x 262144: {rel:.3g} of the "
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
    q4 = llama_cpp_model(shipped_path("gemma3"), 256)
    ids = ids[:256 * 12]
    ours = perplexity(model, ids, 256, bos=ids[0])
    theirs = llama_cpp_perplexity(q4, ids, 256, bos=ids[0])
    print(f"\nGPL-3 ctx 256 ({ours.n_chunks} windows): ggopt {ours.ppl:.4f} +/- "
          f"{ours.ppl_err:.4f}, llama.cpp (Q4_K_M) {theirs:.4f}")
    assert abs(ours.ppl / theirs - 1) < 0.005


def test_chat_turns_rendered_and_tokenized_as_llama_cpp(setup):
    # The 270M file carries no tokenizer.chat_template (ggopt's chat then says so; llama.cpp's
    # tools fall back to ChatML): Gemma's turn format from its instruct template, rendered by
    # ggopt's jinja and by llama.cpp's built-in gemma format, and tokenized by both.
    model, cpp, _ = setup
    from tools.smollm import cache_dir
    path = cache_dir() / "llama.cpp-models" / "templates" / "google-gemma-2-2b-it.jinja"
    if not path.is_file():
        pytest.skip(f"{path} missing: python tools/fetch_models.py llama-vocab")
    template = path.read_text()
    tok = model.require_tokenizer()
    assert tok.chat_template is None
    chat = [{"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "Seven."},
            {"role": "user", "content": "Another one?"}]
    ours = tok.apply_chat_template(chat, add_generation_prompt=True, template=template)
    theirs = cpp_chat(template, chat, True)
    assert ours.removeprefix("<bos>") == theirs
    assert theirs.endswith("<start_of_turn>model\n")
    ids = tok.encode(ours, add_special=False, parse_special=True)
    assert ids == cpp.tokenize(ours.encode(), add_bos=False, special=True)
    assert ids[0] == tok.bos and tok.encode("<end_of_turn>", add_special=False,
                                             parse_special=True) == [106]
