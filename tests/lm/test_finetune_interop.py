"""A fine-tuned model in a real llama.cpp: the merged GGUF's logits and the base with
the LoRA adapter (``lora_path``) equal ggopt's to 1e-3 (F32 KV cache, flash attention off).

Skipped unless ``GGOPT_INTEROP=1`` and ``llama_cpp`` imports."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggopt import backend as gb
from ggopt.lm import lora
from ggopt.lm.export import export
from ggopt.models import llama
from tests.support.finetune import logits as _logits
from tests.support.llama_files import write

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]

CFG = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128)
GGML_TYPE_F32 = 0


def _llama_cpp(path, lora_path=None):
    llama_cpp = pytest.importorskip("llama_cpp")
    kw = {"lora_path": str(lora_path)} if lora_path else {}
    return llama_cpp.Llama(model_path=str(path), n_ctx=CFG.n_ctx, n_batch=CFG.n_ctx,
                           logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                           flash_attn=False, verbose=False, **kw)


def test_merged_model_and_adapter_in_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp")
    base = tmp_path / "base.gguf"
    write(base, CFG)
    net = llama.load(base).net
    ad = lora.create(net, 4, 8.0, seed=3)
    rng = np.random.default_rng(5)
    for t in ad.b.values():  # a trained-looking adapter
        gb.tensor_set(t, (rng.standard_normal((t.ne[1], t.ne[0])) * 0.05).astype(np.float32))
    lora.attach(net, ad)
    tokens = np.frombuffer(b"fine-tuned models, merged or not", np.uint8).astype(np.int32)
    ours = _logits(net, tokens)
    adapter, merged = tmp_path / "adapter.gguf", tmp_path / "merged.gguf"
    lora.save(adapter, ad)
    export(base, merged, lora.merged(llama.get_weights(net), ad), "f32")
    for kw in ({"path": merged}, {"path": base, "lora_path": adapter}):
        llm = _llama_cpp(**kw)
        llm.eval(list(tokens))
        theirs = np.asarray(llm.scores[:len(tokens)], np.float32)
        np.testing.assert_allclose(theirs, ours.reshape(len(tokens), -1), rtol=0, atol=1e-3)
