"""SmolLM2-135M-Instruct in ggopt and in a live llama.cpp (llama-cpp-python; F32 KV cache,
flash attention off). Marker ``interop``, skipped unless ``GGOPT_INTEROP=1``:
``GGOPT_INTEROP=1 python -m pytest -m interop tests/models/test_smollm_interop.py -s`` (``-s`` shows
the measured numbers).

On the F32 copy (``ggopt.models.llama.write_f32``) the logits agree to 1e-3 on 128 tokens of
GPL-3, fed at once and the last 32 one at a time (generation's one-token products), and greedy
generation of 32 tokens is identical. On the Q4_1 file as shipped (and the Q8_0 and K-quant
files of llama.cpp's quantizer), kept, ggopt computes in ggml's float order
(docs/ggml-order.md): its logits and its perplexity of GPL-3 at ctx 256 equal llama.cpp's bit
for bit; the F32 copy too, asked with ``ggml_order=True``. In ggopt's own order the 8-bit
rounding of the activations turns float-rounding differences into whole steps: the logits
differ by up to about 3, the perplexity by up to 0.5 %.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggopt.lm import Generator, SamplingParams, generate, perplexity
from ggopt.models import llama
from tools.smollm import (
    GPL3,
    f32_path,
    ggml_quantized_path,
    llama_cpp_greedy,
    llama_cpp_logits,
    llama_cpp_model,
    llama_cpp_perplexity,
    q4_1_path,
    quantized_path,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]


@pytest.fixture(scope="module")
def setup():
    f32 = f32_path()
    cpp = llama_cpp_model(f32, 256)
    ids = cpp.tokenize(GPL3.read_bytes(), add_bos=True, special=False)
    return llama.load(q4_1_path(), progress=False), cpp, ids


def test_logits_and_greedy_equal_llama_cpp_on_the_f32_copy(setup):
    model, cpp, ids = setup
    prompt = ids[:128]
    ours, theirs = llama.logits(model, prompt), llama_cpp_logits(cpp, prompt)
    diff = float(np.abs(ours - theirs).max())
    print(f"\nF32 copy: largest logit difference over 128 tokens x 49152: {diff:.3g}")
    assert diff < 1e-3
    gen = Generator(model, 128)  # the last 32 tokens one at a time: the one-token products
    steps = [gen.feed(prompt[:96])] + [gen.feed([t]) for t in prompt[96:127]]
    one_token = float(np.abs(np.stack(steps) - theirs[95:127]).max())
    print(f"one token at a time (positions 95..126): largest difference {one_token:.3g}")
    assert one_token < 1e-3
    want = llama_cpp_greedy(cpp, prompt, 32)
    assert generate(model, prompt, 32, SamplingParams(temp=0)).tokens == want


def assert_bits_of_llama_cpp(path, label, ids, ggml_order=None):
    """The file kept (ggml's float order: the default, or ``ggml_order``): the logits of 128,
    77 (a width that is no multiple of 8) and 5 tokens (fewer than 8: ggml's vec_dot for the
    K-quants, its tiled matmul from 8 on) and GPL-3's perplexity at ctx 256 are llama.cpp's bit
    for bit; in ggopt's order they are near them only."""
    cpp = llama_cpp_model(path, 256)
    kept = llama.load(path, progress=False, base_type="keep", ggml_order=ggml_order)
    assert kept.net.ggml_order
    for n in (128, 77, 5):  # (llama.cpp's scores are a view of its buffer: copied)
        ours, theirs = llama.logits(kept, ids[:n]), llama_cpp_logits(cpp, ids[:n]).copy()
        np.testing.assert_array_equal(ours.view(np.int32), theirs.view(np.int32))
    fast = llama.load(path, progress=False, base_type="keep", ggml_order=False)
    theirs = llama_cpp_logits(cpp, ids[:77]).copy()
    diff = np.abs(llama.logits(fast, ids[:77]) - theirs)
    ppl, want = perplexity(kept, ids, 256), llama_cpp_perplexity(cpp, ids, 256)
    print(f"\n{label} kept: logits of 128, 77 and 5 tokens equal llama.cpp's bit for bit "
          f"(ggopt's order: max {diff.max():.3g}, mean {diff.mean():.3g}); GPL-3 ctx 256 "
          f"{ppl.ppl!r} against {want!r}; {ppl.tokens_per_second:.0f} tokens/s")
    assert ppl.ppl == want


def test_q4_1_kept_gives_llama_cpp_s_bits(setup):
    assert_bits_of_llama_cpp(q4_1_path(), "Q4_1 as shipped", setup[2])


def test_perplexity_of_gpl3_at_ctx_256_within_half_a_percent(setup):
    model, cpp, ids = setup
    ours = perplexity(model, ids, 256)
    theirs = llama_cpp_perplexity(cpp, ids, 256)
    print(f"\nGPL-3 ctx 256 ({ours.n_chunks} windows): ggopt {ours.ppl:.4f} +/- "
          f"{ours.ppl_err:.4f}, llama.cpp {theirs:.4f}; {ours.tokens_per_second:.0f} tokens/s")
    assert abs(ours.ppl / theirs - 1) < 0.005


@pytest.mark.slow
def test_q8_0_file_of_llama_cpp_s_quantizer_kept_gives_its_bits(setup):
    assert_bits_of_llama_cpp(quantized_path("Q8_0"), "Q8_0", setup[2])


def test_q4_k_m_file_of_llama_cpp_s_quantizer_kept_gives_its_bits(setup):
    """Q4_K and Q6_K products (SmolLM2's 576-wide rows fall back to Q5_0/Q8_0): ggml's tiled
    K-quant matmul's order."""
    assert_bits_of_llama_cpp(quantized_path("Q4_K_M"), "Q4_K_M", setup[2])


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["Q2_K", "Q3_K_M", "Q5_K_M"])
def test_other_k_quant_files_of_llama_cpp_s_quantizer_kept_give_their_bits(setup, ftype):
    """The other K-quant mixes (Q2_K's file holds Q3_K and Q4_0 matrices)."""
    assert_bits_of_llama_cpp(quantized_path(ftype), ftype, setup[2])


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K"])
def test_k_quant_matrices_of_ggml_s_quantizer_in_ggml_order_give_their_bits(setup, qtype):
    """The F32 copy with its 30 ffn_down matrices quantized by ggml's own quantize_chunk (the
    only SmolLM2 matrices of whole super-blocks; llama.cpp's Q2_K file type puts no Q2_K
    matrix there): with F32 matrices, ordered on request."""
    assert_bits_of_llama_cpp(ggml_quantized_path(qtype), f"{qtype} ffn_down", setup[2],
                             ggml_order=True)


@pytest.mark.slow
def test_f32_copy_in_ggml_order_gives_llama_cpp_s_bits(setup):
    assert_bits_of_llama_cpp(f32_path(), "F32 copy", setup[2], ggml_order=True)
