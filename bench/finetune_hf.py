"""The fine-tune bench's Hugging Face anchor: ``transformers`` + ``peft`` on SmolLM2's weights.

The issue's reference numbers come from PyTorch eager with ``transformers``' own
``LlamaForCausalLM`` (SDPA attention) and ``peft``'s LoRA. This module builds that model from
the same GGUF file the other configurations read (no hub: the config from the file's
``llama.*`` keys, the weights from ggopt's loader with llama.cpp's rope permutation of
``attn_q``/``attn_k`` undone), so ``bench.bench_finetune``'s ``hf-full`` and ``hf-lora`` time
the library code people actually run. Needs ``pip install transformers peft`` (not a
dependency of ggopt).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

# GGUF tensor name (after "blk.N.") -> transformers' module path inside layer N.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
HF_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives ``attn_q``/``attn_k`` (each head's rows
    interleaved pairwise for ggml's normal rope) back to Hugging Face's half-split order."""
    n_out, n_in = w.shape
    return w.reshape(n_head, n_out // n_head // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def _outer_tensors(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state dict's tensors outside the layers: embeddings, final norm, untied output."""
    out = {"model.embed_tokens.weight": weights["token_embd.weight"],
           "model.norm.weight": weights["output_norm.weight"]}
    if "output.weight" in weights:
        out["lm_head.weight"] = weights["output.weight"]
    return out


def hf_state_dict(weights: dict[str, np.ndarray], n_head: int, n_head_kv: int
                  ) -> dict[str, np.ndarray]:
    """transformers' LlamaForCausalLM state dict from a llama GGUF's F32 tensors."""
    out = _outer_tensors(weights)
    for name, w in weights.items():
        if not name.startswith("blk."):
            continue
        _, layer, kind, _ = name.split(".")
        if kind == "attn_q":
            w = unpermute_rope(w, n_head)
        elif kind == "attn_k":
            w = unpermute_rope(w, n_head_kv)
        out[f"model.layers.{layer}.{_LAYER_NAMES[kind]}.weight"] = w
    return out


def build_model(torch: Any, cfg: Any, weights: dict[str, np.ndarray], lora_rank: int = 0) -> Any:
    """A transformers llama holding ``weights``; with ``lora_rank`` wrapped by peft (alpha
    2 * rank on the seven projections, no dropout), else every weight trainable."""
    import transformers

    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.n_vocab, hidden_size=cfg.n_embd, intermediate_size=cfg.n_ff,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head_kv, head_dim=cfg.head_dim, rms_norm_eps=cfg.eps,
        rope_theta=cfg.freq_base, max_position_embeddings=max(cfg.n_ctx, 2048),
        tie_word_embeddings="output.weight" not in weights, attention_bias=False,
        mlp_bias=False, hidden_act="silu")
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_cfg)
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in hf_state_dict(weights, cfg.n_head, cfg.n_head_kv).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.train()
    if lora_rank:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(
            r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, bias="none",
            target_modules=HF_TARGETS))
    return model


def _family_config(transformers: Any, cfg: Any) -> Any:
    """transformers' config of ``cfg``'s family (qwen2, qwen3, gemma3), SDPA attention."""
    common = {"vocab_size": cfg.n_vocab, "hidden_size": cfg.n_embd,
              "intermediate_size": cfg.n_ff, "num_hidden_layers": cfg.n_layer,
              "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv,
              "head_dim": cfg.head_dim, "rms_norm_eps": cfg.eps,
              "max_position_embeddings": max(cfg.n_ctx, 2048),
              "tie_word_embeddings": cfg.tied_output, "attn_implementation": "sdpa"}
    rope = {"rope_type": "default", "rope_theta": cfg.freq_base}
    if cfg.arch == "qwen2":
        return transformers.Qwen2Config(rope_parameters=rope, **common)
    if cfg.arch == "qwen3":
        return transformers.Qwen3Config(rope_parameters=rope, **common)
    if cfg.arch != "gemma3":
        raise ValueError(f"no transformers class here for {cfg.arch!r}")
    layer_types = ["sliding_attention" if cfg.is_swa(i) else "full_attention"
                   for i in range(cfg.n_layer)]
    return transformers.Gemma3TextConfig(
        sliding_window=cfg.n_swa, layer_types=layer_types, query_pre_attn_scalar=cfg.head_dim,
        final_logit_softcapping=cfg.softcap or None, hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg.freq_base_swa}}, **common)


def family_state_dict(cfg: Any, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' state dict of a qwen2/qwen3/gemma3 GGUF's F32 tensors (no q/k
    permutation: these families rope by halves; Gemma's norms stored as ``1 + w``)."""
    gemma = cfg.arch == "gemma3"
    names = {**_LAYER_NAMES, "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm",
             "post_attention_norm": "post_attention_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm"}
    if gemma:
        names["ffn_norm"] = "pre_feedforward_layernorm"
    out = _outer_tensors(weights)
    for name, w in weights.items():
        if not name.startswith("blk."):
            continue
        _, layer, kind, suffix = name.split(".")
        if gemma and kind.endswith("norm"):
            w = w - np.float32(1)
        out[f"model.layers.{layer}.{names[kind]}.{suffix}"] = w
    if gemma:
        out["model.norm.weight"] = out["model.norm.weight"] - np.float32(1)
    return out


def build_family_model(torch: Any, cfg: Any, weights: dict[str, np.ndarray]) -> Any:
    """transformers' own ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` or ``Gemma3ForCausalLM``
    holding ``weights``, every weight trainable."""
    import transformers

    hf_cfg = _family_config(transformers, cfg)
    cls = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "gemma3": transformers.Gemma3ForCausalLM}[cfg.arch]
    model = cls(hf_cfg)
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in family_state_dict(cfg, weights).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.train()
    return model


#: PyTorch's precisions: fp32; the model in bf16 (``model.to(torch.bfloat16)`` before PEFT
#: wraps it); fp32 weights under ``torch.autocast("cpu", dtype=torch.bfloat16)``.
HF_MODES = ("fp32", "bf16", "autocast")


def run_hf(lora_rank: int, steps: int, windows: Any, cfg: Any, weights: dict[str, np.ndarray],
           threads: int, mode: str = "fp32") -> list[float]:
    """Time ``steps`` AdamW steps (lr 1e-5) of one window each in ``mode`` (:data:`HF_MODES`);
    return the step times."""
    import contextlib

    import torch

    torch.set_num_threads(threads)
    model = build_model(torch, cfg, weights, 0) if cfg.arch == "llama" else \
        build_family_model(torch, cfg, weights)
    weights.clear()
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    if lora_rank:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(
            r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, bias="none",
            target_modules=HF_TARGETS))
    params = [p for p in model.parameters() if p.requires_grad]

    def logits(tok: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else \
                contextlib.nullcontext():
            return model(input_ids=tok).logits.float()

    return time_adamw_steps(torch, params, logits, windows, steps)


def time_adamw_steps(torch: Any, params: list[Any], logits_of: Callable[[Any], Any],
                     windows: Any, steps: int) -> list[float]:
    """Times of ``steps`` PyTorch AdamW steps (lr 1e-5, ggml's betas and eps, no decay), each
    the mean cross-entropy of ``logits_of(tokens)`` over one window (cycling)."""
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    tokens = torch.tensor(windows.tokens.astype(np.int64))
    labels = torch.tensor(windows.labels.astype(np.int64))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        j = i % len(windows)
        z = logits_of(tokens[j:j + 1])
        loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), labels[j])
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return times
