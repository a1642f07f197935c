"""A LoRA adapter made on SmolLM2's Q4_1 file as shipped (``base_type="keep"``) in a live
llama.cpp (llama-cpp-python, ``lora_path``; F32 KV cache, flash attention off). Markers
``interop`` and ``model``; skipped unless ``GGOPT_INTEROP=1``.

- Against the F32 copy of the file, llama.cpp computes what ggopt computes (F32 products of the
  exactly dequantized weights): base + adapter logits equal ggopt's to 1e-3.
- Against the Q4_1 file itself, ggopt's base computes in ggml's float order: its logits are
  llama.cpp's bit for bit (``tests/models/test_smollm_interop.py``). The adapter's products
  are in ggopt's order, and the 8-bit rounding of the activations turns that into whole steps:
  with the adapter the logits differ by that rounding. The adapter's own contribution (``B(A
  x)`` in F32 in both) must agree: the change the adapter makes to llama.cpp's logits equals
  the change it makes to ggopt's to within a few percent of its size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ggopt import backend as gb
from ggopt.lm import lora
from ggopt.models import llama
from tools.smollm import f32_path, llama_cpp_model, q4_1_path

pytestmark = [
    pytest.mark.interop,
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]

REF = json.loads((Path(__file__).parents[1] / "data" / "smollm2_reference.json").read_text())
IDS = REF["gpl3_tokens_1024"][:64]


def _cpp_logits(path, lora_path=None):
    llm = llama_cpp_model(path, 64, lora_path=lora_path)
    llm.eval(IDS)
    return np.asarray(llm.scores[:len(IDS)], np.float32)


def _adapted(base_type: str, path: Path | None = None):
    """(logits without, with the adapter) of the Q4_1 file loaded as ``base_type`` with one
    seeded adapter (saved to ``path`` when given)."""
    model = llama.load(q4_1_path(), progress=False, base_type=base_type)
    base = llama.logits(model, IDS)
    ad = lora.create(model.net, 8, 16.0, seed=0)
    rng = np.random.default_rng(7)
    for t in ad.b.values():  # a trained-looking adapter (the same values every time)
        gb.tensor_set(t, (rng.standard_normal((t.ne[1], t.ne[0])) * 0.05).astype(np.float32))
    lora.attach(model.net, ad)
    if path is not None:
        lora.save(path, ad)
    return base, llama.logits(model, IDS)


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora") / "adapter.gguf"
    base, ours = _adapted("keep", path)
    return base, ours, path


def test_adapter_on_the_f32_copy_equals_ggopt_to_1e_3(adapted):
    _, _, path = adapted
    _, ours = _adapted("f32")  # the dequantized load: F32 products, as on the F32 copy
    diff = float(np.abs(_cpp_logits(f32_path(), path) - ours).max())
    print(f"\nF32 copy + adapter: largest logit difference {diff:.3g}")
    assert diff < 1e-3


def test_adapter_on_the_q4_1_file_changes_the_logits_as_in_ggopt(adapted):
    base, ours, path = adapted
    cpp_base, cpp = _cpp_logits(q4_1_path()), _cpp_logits(q4_1_path(), path)
    delta_ours, delta_cpp = ours - base, cpp - cpp_base
    rel = float(np.linalg.norm(delta_cpp - delta_ours) / np.linalg.norm(delta_ours))
    base_diff, diff = float(np.abs(cpp_base - base).max()), float(np.abs(cpp - ours).max())
    span = float(np.ptp(cpp))
    print(f"\nQ4_1 + adapter: the adapter moves ggopt's logits by up to "
          f"{np.abs(delta_ours).max():.3g}; llama.cpp's move differs from it by {100 * rel:.1f} % "
          f"(Frobenius); largest logit difference {diff:.3g} with the adapter, {base_diff:.3g} "
          f"without (logits span {span:.1f})")
    assert rel < 0.5  # the same change (a missing, mis-scaled or transposed adapter: >= 100 %)
    # the base in ggml's float order is llama.cpp's bit for bit; the adapter's products are in
    # ggopt's order (docs/ggml-order.md), so the adapted logits differ by the 8-bit rounding's
    assert base_diff == 0 and diff < 0.05 * span
    assert float(np.mean(cpp.argmax(-1) == ours.argmax(-1))) > 0.9
