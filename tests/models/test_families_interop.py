"""qwen2, qwen3 and gemma3 in ggopt and in a live llama.cpp (llama-cpp-python; F32 KV cache,
flash attention off) on small random models (issue 31). Marker ``interop``, skipped unless
``GGOPT_INTEROP=1``: ``GGOPT_INTEROP=1 python -m pytest -m interop
tests/models/test_families_interop.py -s`` (``-s`` shows the measured numbers).

Logits equal to 1e-3 of their largest magnitude at ctx 64 (gemma3's window of 8 crossed many
times), fed at once and one token at a time; greedy generation of 32 tokens identical;
perplexity at ctx 64 within 0.1 %; after a LoRA step, the merged GGUF and the base with the
adapter give llama.cpp the perplexity ggopt reports (within 1 %).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggopt import backend as gb
from ggopt.lm import Generator, SamplingParams, generate, lora, perplexity
from ggopt.lm.export import export
from ggopt.models import llama, load
from tests.support.families import FAMILIES, text_tokens, write_family
from tools.smollm import (
    llama_cpp_greedy,
    llama_cpp_logits,
    llama_cpp_model,
    llama_cpp_perplexity,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]
NAMES = sorted(FAMILIES)


@pytest.mark.parametrize("arch", NAMES)
def test_logits_greedy_and_perplexity_equal_llama_cpp(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_family(path, arch)
    model = load(path, progress=False)
    cpp = llama_cpp_model(path, 64)
    ids = text_tokens(64)
    ours, theirs = llama.logits(model, ids), llama_cpp_logits(cpp, ids)
    rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    gen = Generator(model, 64)
    steps = np.stack([gen.feed(ids[:32])] + [gen.feed([t]) for t in ids[32:63]])
    rel_step = float(np.abs(steps - theirs[31:63]).max() / np.abs(theirs).max())
    print(f"\n{arch}: logits at ctx 64 differ by {rel:.2g} of their largest, "
          f"{rel_step:.2g} one token at a time")
    assert rel < 1e-3 and rel_step < 1e-3
    prompt = list(ids[:16])
    want = llama_cpp_greedy(cpp, prompt, 32)
    assert generate(model, prompt, 32, SamplingParams(temp=0)).tokens == want
    text = text_tokens(640)
    ppl, ref = perplexity(model, text, 64).ppl, llama_cpp_perplexity(cpp, list(text), 64)
    print(f"{arch}: perplexity ggopt {ppl:.5f}, llama.cpp {ref:.5f}")
    assert abs(ppl / ref - 1) < 1e-3


@pytest.mark.parametrize("arch", NAMES)
def test_fine_tuned_merged_model_and_adapter_in_llama_cpp(tmp_path, arch):
    base = tmp_path / "base.gguf"
    write_family(base, arch)
    model = load(base, progress=False)
    net = model.net
    ad = lora.create(net, 4, 8.0, seed=3)
    rng = np.random.default_rng(5)
    for t in ad.b.values():  # a trained-looking adapter
        gb.tensor_set(t, (rng.standard_normal((t.ne[1], t.ne[0])) * 0.05).astype(np.float32))
    lora.attach(net, ad)
    text = text_tokens(384)
    ours = perplexity(model, text, 64).ppl
    adapter, merged = tmp_path / "adapter.gguf", tmp_path / "merged.gguf"
    lora.save(adapter, ad)
    export(base, merged, lora.merged(llama.get_weights(net), ad), "f32")
    for kw in ({"path": merged}, {"path": base, "lora_path": adapter}):
        theirs = llama_cpp_perplexity(llama_cpp_model(n_ctx=64, **kw), list(text), 64)
        print(f"\n{arch} {'adapter' if 'lora_path' in kw else 'merged'}: perplexity "
              f"ggopt {ours:.5f}, llama.cpp {theirs:.5f}")
        assert abs(ours / theirs - 1) < 0.01
