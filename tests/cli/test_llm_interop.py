"""The example's GGUF in a real llama.cpp: same tokens, same logits (to 1e-4).

Needs ``llama-cpp-python`` (it builds llama.cpp from source: ``pip install llama-cpp-python``)
and ``GGOPT_INTEROP=1`` in the environment; otherwise skipped. Run with
``GGOPT_INTEROP=1 python -m pytest -m interop tests/cli/test_llm_interop.py``.
llama.cpp runs with an F32 KV cache and flash attention off: its defaults (F16 cache, flash
attention) change logits by ~1e-2.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggopt import backend as gb
from ggopt.models import llama
from ggopt.models.llama import byte_gguf
from tests.support.llm_ref import logits as ref_logits
from tests.support.llm_ref import random_weights

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(os.environ.get("GGOPT_INTEROP") != "1",
                       reason="set GGOPT_INTEROP=1 to run tests against a real llama.cpp"),
]

GGML_TYPE_F32 = 0


def _weights(cfg: llama.Config) -> dict[str, np.ndarray]:
    return random_weights(llama.param_shapes(cfg), 7)


def test_llama_cpp_logits_match(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    cfg = llama.Config(n_ctx=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96)
    w = _weights(cfg)
    path = tmp_path / "llm.gguf"
    byte_gguf.save(path, cfg, w)
    prompt = b"def f(x):\n    return x\xff\x00 # \xc3\xa9"
    tokens = list(prompt)  # a byte model: the bytes are the token ids

    # ggopt's logits for the prompt: the model loaded back from the file.
    cfg2, w2 = byte_gguf.load(path)
    model = llama.build_model(cfg2, gb.Scheduler([gb.cpu_init()]))
    llama.set_weights(model, w2, "interop")
    inp = llama.make_inputs(model, 1)
    import ggopt

    ctx = ggopt.Context()
    out = llama.build_logits(ctx, model, inp)
    gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, False)
    ggopt.build_forward_expand(gf, out)
    model.sched.alloc_graph(gf)
    padded = np.zeros(cfg.n_ctx, np.int32)
    padded[:len(tokens)] = tokens
    gb.tensor_set(inp.tokens, padded)
    model.sched.graph_compute(gf)
    ours = gb.tensor_get(out).reshape(cfg.n_ctx, 256)[:len(tokens)]
    np.testing.assert_allclose(ours, ref_logits(cfg, w, np.array(tokens)), atol=1e-4)

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=cfg.n_ctx, n_batch=cfg.n_ctx,
                          logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                          flash_attn=False, verbose=False)
    assert llm.tokenize(prompt, add_bos=False, special=False) == tokens
    assert llm.detokenize(tokens) == prompt
    llm.eval(tokens)
    theirs = np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)
