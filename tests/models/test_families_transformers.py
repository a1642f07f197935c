"""qwen2, qwen3 and gemma3 against Hugging Face ``transformers``' own classes
(``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``Gemma3ForCausalLM``, eager attention, float64)
with the same weights: ggopt's logits equal theirs to 1e-4 of their largest magnitude
(issue 31). Skipped without torch or transformers.

The weights go over as llama.cpp's converter wrote them, undone: no q/k permutation (these
families rope by halves, NEOX, as transformers' ``rotate_half``), and Gemma's norm weights
stored with the 1 of ``(1 + w)`` added.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggopt.models import load
from ggopt.models.llama.run import logits
from tests.support.families import FAMILIES, text_tokens, write_family

NAMES = sorted(FAMILIES)


def _hf_config(cfg, transformers):
    common = {"vocab_size": cfg.n_vocab, "hidden_size": cfg.n_embd,
              "intermediate_size": cfg.n_ff, "num_hidden_layers": cfg.n_layer,
              "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv,
              "head_dim": cfg.head_dim, "rms_norm_eps": cfg.eps,
              "max_position_embeddings": cfg.n_ctx, "tie_word_embeddings": cfg.tied_output,
              "attn_implementation": "eager"}
    rope = {"rope_type": "default", "rope_theta": cfg.freq_base}
    if cfg.arch == "qwen2":
        return transformers.Qwen2Config(rope_parameters=rope, **common)
    if cfg.arch == "qwen3":
        return transformers.Qwen3Config(rope_parameters=rope, **common)
    layer_types = ["sliding_attention" if cfg.is_swa(i) else "full_attention"
                   for i in range(cfg.n_layer)]
    return transformers.Gemma3TextConfig(
        sliding_window=cfg.n_swa, layer_types=layer_types, query_pre_attn_scalar=cfg.head_dim,
        final_logit_softcapping=cfg.softcap or None, hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg.freq_base_swa}}, **common)


def _hf_state(cfg, w):
    """transformers' state dict from llama.cpp's names (Gemma's norms: the stored w - 1)."""
    gemma = cfg.arch == "gemma3"
    norm = (lambda a: a - 1.0) if gemma else (lambda a: a)
    ffn_norm = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
    out = {"model.embed_tokens.weight": w["token_embd.weight"],
           "model.norm.weight": norm(w["output_norm.weight"])}
    if not cfg.tied_output:
        out["lm_head.weight"] = w["output.weight"]
    for i in range(cfg.n_layer):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
        for ours, theirs in names.items():
            out[h + theirs + ".weight"] = w[b + ours + ".weight"]
            if b + ours + ".bias" in w:
                out[h + theirs + ".bias"] = w[b + ours + ".bias"]
        norms = {"attn_norm": "input_layernorm", "ffn_norm": ffn_norm,
                 "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                 "post_attention_norm": "post_attention_layernorm",
                 "post_ffw_norm": "post_feedforward_layernorm"}
        for ours, theirs in norms.items():
            if b + ours + ".weight" in w:
                out[h + theirs + ".weight"] = norm(w[b + ours + ".weight"])
    return out


@pytest.mark.parametrize("arch", NAMES)
def test_logits_equal_transformers(tmp_path, arch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = FAMILIES[arch]
    path = tmp_path / f"{arch}.gguf"
    w = write_family(path, arch)
    hf_cfg = _hf_config(cfg, transformers)
    cls = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "gemma3": transformers.Gemma3ForCausalLM}[arch]
    model = cls(hf_cfg).to(torch.float64).eval()
    state = {k: torch.tensor(v.astype(np.float64)) for k, v in _hf_state(cfg, w).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    ids = text_tokens(cfg.n_ctx)
    with torch.no_grad():
        theirs = model(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()
    ours = logits(load(path, progress=False), ids)
    rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    print(f"\n{arch}: ggopt vs transformers, largest logit difference {rel:.2g} of the "
          f"largest logit")
    assert rel < 1e-4
