"""Small random models of each family (llama.cpp's keys and tensor names, ggopt's byte
vocabulary) for the family tests: :data:`FAMILIES` by ``general.architecture``."""

from __future__ import annotations

import numpy as np

from ggopt.models import llama
from tests.support.llama_files import write
from tests.support.llm_ref import random_weights

_COMMON = {"n_ctx": 64, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128, "eps": 1e-6}

#: One small config per family; gemma3's window (8) is smaller than the context, its third
#: layer global (pattern 3), its local layers on their own rope base.
FAMILIES: dict[str, llama.Config] = {
    "qwen2": llama.Config(arch="qwen2", n_layer=2, qkv_bias=True, freq_base=1e6, **_COMMON),
    "qwen3": llama.Config(arch="qwen3", n_layer=2, n_embd_head=32, tied_output=True,
                          freq_base=1e6, **_COMMON),
    "gemma3": llama.Config(arch="gemma3", n_layer=3, n_embd_head=32, tied_output=True,
                           n_swa=8, swa_layers=(True, True, False), freq_base=1e6,
                           freq_base_swa=1e4, softcap=30.0,
                           attn_scale=float(np.float32(1) / np.sqrt(np.float32(32))),
                           **_COMMON),
}

TEXT = (b"Sliding windows, per-head norms and biases: three families computed by one graph "
        b"builder, each as llama.cpp computes it. ")


def text_tokens(n: int) -> np.ndarray:
    """``n`` byte tokens of :data:`TEXT` repeated."""
    reps = -(-n // len(TEXT))
    return np.frombuffer(TEXT * reps, np.uint8)[:n].astype(np.int32)


def peaked_weights(cfg: llama.Config, seed: int = 7) -> dict[str, np.ndarray]:
    """:func:`llm_ref.random_weights` with the output projection (the tied embeddings) 2x
    larger: peaked logits, so that a wrong graph moves the perplexity a lot."""
    w = random_weights(llama.param_shapes(cfg), seed)
    out = "token_embd.weight" if cfg.tied_output else "output.weight"
    w[out] = w[out] * np.float32(2)
    return w


def write_family(path: object, arch: str, **kw: object) -> dict[str, np.ndarray]:
    """Write :data:`FAMILIES` ``[arch]`` with :func:`peaked_weights` (``kw``: as
    :func:`llama_files.write`); return its weights."""
    cfg = FAMILIES[arch]
    return write(path, cfg, weights=peaked_weights(cfg), **kw)  # type: ignore[arg-type]


def cpp_chat(template: str, messages: list[dict[str, str]], add_ass: bool) -> str:
    """llama.cpp's ``llama_chat_apply_template`` (its built-in format for ``template``)."""
    import ctypes

    import pytest

    llama_cpp = pytest.importorskip("llama_cpp")
    msgs = (llama_cpp.llama_chat_message * len(messages))(*[
        llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode())
        for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template.encode(), msgs, len(messages), add_ass,
                                            buf, len(buf))
    assert 0 < n < len(buf)
    return buf.raw[:n].decode()
