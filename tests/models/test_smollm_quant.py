"""SmolLM2-135M-Instruct Q4_1 as shipped, loaded with ``base_type="keep"`` (marker ``model``):
its matrices stay Q4_1/Q8_0 (mapped from the file), its products are ggml's integer products
(the activations rounded to Q8_1 / Q8_0 blocks, as llama.cpp's CPU backend computes them), and
its GPL-3 perplexity at ctx 256 is within 0.5 % of llama.cpp's on the same file
(tests/data/smollm2_reference.json, written by tools/llama_reference.py).

The 8-bit rounding makes the logits sensitive: a value on a rounding boundary moves a whole
step, so the F32-dequantized load's logits differ by up to a few units (not by float
rounding); tests/models/test_smollm_interop.py measures the difference to llama.cpp.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ggopt
from ggopt.lm import perplexity
from ggopt.models import llama
from ggopt.models.llama.mapped import base_bytes
from tools.smollm import GPL3, q4_1_path

pytestmark = pytest.mark.model

REF = json.loads((Path(__file__).parents[1] / "data" / "smollm2_reference.json").read_text())


@pytest.fixture(scope="module")
def kept():
    return llama.load(q4_1_path(), progress=False, base_type="keep")


def test_weights_stay_quantized_and_mapped(kept):
    types = {n: t.type for n, t in kept.net.params.items()}
    assert types["token_embd.weight"] is ggopt.GGType.Q8_0
    assert sum(t is ggopt.GGType.Q4_1 for t in types.values()) == 210
    held, as_f32, mapped = base_bytes(kept.net)
    assert held <= 0.2 * as_f32 and mapped >= held - 1_000_000  # only the norms are copies
    print(f"\nbase weights {held / 1e6:.1f} MB = {held / as_f32:.3f}x of F32's "
          f"{as_f32 / 1e6:.1f} MB")


def test_logits_are_the_f32_load_s_moved_by_the_8_bit_rounding(kept):
    ids = REF["gpl3_tokens_1024"][:128]
    want = llama.logits(llama.load(q4_1_path(), progress=False), ids)
    got = llama.logits(kept, ids)
    diff = np.abs(got - want)
    agree = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    print(f"\nkept Q4_1 vs F32-dequantized: largest logit difference {diff.max():.3g}, mean "
          f"{diff.mean():.3g}, top-1 agreement {100 * agree:.1f} %")
    assert 0 < diff.max() < 0.05 * np.ptp(want) and agree > 0.9


@pytest.mark.slow
def test_gpl3_perplexity_at_ctx_256_within_half_a_percent_of_llama_cpp(kept):
    ids = kept.require_tokenizer().encode(GPL3.read_text(), add_special=True,
                                             parse_special=False)
    r = perplexity(kept, ids, 256)
    want = REF["q4_1_ppl_gpl3_ctx256"]
    print(f"\nGPL-3 ctx 256: ggopt (Q4_1 kept) {r.ppl:.4f}, llama.cpp (Q4_1) {want:.4f}: "
          f"{100 * (r.ppl / want - 1):+.3f} %")
    assert abs(r.ppl / want - 1) < 0.005
