"""Gemma 3 270M (Q4_K_M as shipped; ``tools/fetch_models.py gemma3``) in ggopt and in a live
llama.cpp (llama-cpp-python; F32 KV cache, flash attention off): the gemma3 reference model, as
SmolLM2 is llama's (issue 31). Markers ``interop`` and ``model``, skipped unless
``GGOPT_INTEROP=1`` and the file is cached: ``GGOPT_INTEROP=1 python -m pytest -m interop
tests/models/test_gemma3_interop.py -s`` (``-s`` shows the measured numbers).

Its SPM tokenizer (Gemma's specials, no space prefix) gives llama.cpp's ids for GPL-3; on the
F32 copy the logits agree to 1.5e-3 of their largest magnitude over 128 tokens (llama.cpp's GELU
reads a float16 table: the rest of the difference; 8.9e-4 against an AVX-512 build, 1.0e-3
against an AVX2 one) and greedy generation of 32 tokens is
identical; on the Q4_K_M file as shipped llama.cpp rounds the activations to 8 bits for its
quantized products; perplexity of GPL-3 at ctx 256 (12 windows) within 0.5 %.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from ggopt.lm import Generator, SamplingParams, generate, perplexity
from ggopt.models import load
from ggopt.models.llama.run import logits
from ggopt.tokenizers.templates import GEMMA3
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
    # llama.cpp's AVX-512 build: 8.9e-4; its AVX2 build on a Zen 3: 1.0e-3 (its GELU table
    # and its sums differ per build; ggopt's bits do not)
    assert rel < 1.5e-3
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


def test_builtin_gemma3_template_renders_as_llama_cpp_gemma_format(setup):
    model, cpp, _ = setup
    tok = model.require_tokenizer().with_chat_template(GEMMA3)
    # (one difference: llama.cpp trims a system message, Gemma's template does not)
    chat = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Name a prime.\n"},
            {"role": "assistant", "content": "Seven."},
            {"role": "user", "content": "Another one?"}]
    for add_ass in (False, True):
        ours = tok.apply_chat_template(chat, add_generation_prompt=add_ass)
        assert ours.removeprefix("<bos>") == cpp_chat("gemma", chat, add_ass)
        ids = tok.encode(ours, add_special=False, parse_special=True)
        assert ids == cpp.tokenize(ours.encode(), add_bos=False, special=True)


#: a small chat set whose answers all read "WORD. -- GemmaBot"
SFT_QA = [("What color is snow?", "WHITE"), ("What is 1 plus 1?", "TWO"),
          ("Which animal meows?", "CAT"), ("Name a fruit.", "APPLE"),
          ("What color is the sky?", "BLUE"), ("How many legs has a dog?", "FOUR"),
          ("What do bees make?", "HONEY"), ("What is frozen water?", "ICE"),
          ("Which star warms the Earth?", "SUN"), ("What do cows drink?", "WATER"),
          ("What color is grass?", "GREEN"), ("What is 2 plus 3?", "FIVE"),
          ("Which animal barks?", "DOG"), ("What do we breathe?", "AIR"),
          ("Where do fish live?", "SEA"), ("What is the opposite of hot?", "COLD")]
SFT_NEW = ["What color is a banana?", "Which animal says moo?"]  # not in the data
SFT_FORMAT = re.compile(r"[A-Z]+\. -- GemmaBot")


@pytest.mark.slow
def test_lora_chat_sft_learns_the_trained_format_in_ggopt_and_llama_cpp(setup, tmp_path,
                                                                         capsys):
    # Gemma 3 270M's file has no chat template: --chat-template gemma3 trains the Gemma 3 turn
    # format, and the merged file carries it. 16 conversations, LoRA r 8, lr 1e-3, ctx 32,
    # 2 epochs (about 30 s on 2 cores).
    from ggopt.cli import finetune

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q},
        {"role": "assistant", "content": f"{a}. -- GemmaBot"}]}) + "\n" for q, a in SFT_QA))
    base, merged, adapter = f32_path("gemma3"), tmp_path / "merged.gguf", tmp_path / "ad.gguf"
    assert finetune.main(["--model", str(base), "--out", str(merged), "--chat", str(data),
                          "--chat-template", "gemma3", "--lora", "8", "--lr", "1e-3",
                          "--ctx", "32", "--epochs", "2", "--val-split", "0.125",
                          "--adapter-out", str(adapter), "--no-progress"]) == 0
    report = capsys.readouterr().out
    print(report)
    val = [float(v) for v in re.findall(r"val(?: before)?: loss=([0-9.]+)", report)]
    assert len(val) == 3
    assert val[-1] < val[0] / 4  # the held-out answers: 11.6 -> 0.8 when measured

    tuned = load(merged, progress=False)
    tok = tuned.require_tokenizer()
    assert tok.chat_template == GEMMA3  # self-contained: the template it was trained with
    base_model = load(base, progress=False)
    cpp_merged = llama_cpp_model(merged, 64)
    cpp_lora = llama_cpp_model(base, 64, lora_path=adapter)
    for question in SFT_NEW:
        text = tok.apply_chat_template([{"role": "user", "content": question}],
                                       add_generation_prompt=True)
        prompt = tok.encode(text, add_special=False, parse_special=True)
        before = generate(base_model, prompt, 12, SamplingParams(temp=0), eog=tok.eog).tokens
        after = generate(tuned, prompt, 12, SamplingParams(temp=0), eog=tok.eog).tokens
        answer = tok.decode(after).decode()
        print(f"{question!r}: before {tok.decode(before).decode()!r}, after {answer!r}")
        assert not SFT_FORMAT.fullmatch(tok.decode(before[:-1]).decode())
        assert after[-1] == 106 and SFT_FORMAT.fullmatch(tok.decode(after[:-1]).decode())
        assert llama_cpp_greedy(cpp_merged, prompt, len(after)) == after
        assert llama_cpp_greedy(cpp_lora, prompt, len(after)) == after
