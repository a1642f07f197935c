"""The model families ggopt runs, each stated as what it changes in llama's graph.

llama.cpp keeps one graph file per architecture (``src/models/<arch>.cpp``) over a shared
graph context; ggopt keeps one builder (:mod:`.graph`) and one :class:`Architecture` per
``general.architecture``, listing the differences from llama:

- **llama**: NORMAL (adjacent pairs) rope, SwiGLU feed-forward, scale ``1/sqrt(head size)``.
- **qwen2** (Qwen2, Qwen2.5): NEOX (halves) rope; biases on q, k, v.
- **qwen3**: NEOX rope; an RMS norm on each head of Q and K before rope (``attn_q_norm``,
  ``attn_k_norm``, of the head size); the head size ``qwen3.attention.key_length``.
- **gemma3**: NEOX rope; the embeddings scaled by ``sqrt(n_embd)``; q/k norms; norms after
  attention and after the feed-forward (``post_attention_norm``, ``post_ffw_norm``) before
  the residual adds; a GELU-gated feed-forward (ggml's tanh GELU); Q scaled before the
  product (``1/sqrt(head size)``, ``1/sqrt(n_embd/n_head)`` for the 62-layer 27B); sliding
  window attention on the layers of a pattern (five of every six by default) with their own
  rope base; an optional final logit soft-capping.
"""

from __future__ import annotations

import dataclasses

from ...errors import ShapeError

__all__ = ["Architecture", "ARCHITECTURES", "architecture"]

ROPE_NORMAL, ROPE_NEOX = 0, 2  # ggml's rope modes (ggopt.ROPE_TYPE_NORMAL, ggopt.ROPE_TYPE_NEOX)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What one ``general.architecture`` changes in llama's graph (see the module doc)."""

    name: str
    rope_type: int = ROPE_NORMAL
    qk_norm: bool = False  # attn_q_norm / attn_k_norm per head before rope
    post_norms: bool = False  # post_attention_norm / post_ffw_norm before the residual adds
    embd_scale: bool = False  # token embeddings times sqrt(n_embd)
    ffn_gelu: bool = False  # GELU-gated feed-forward (else SwiGLU)
    scale_q: bool = False  # Q scaled by the attention scale before K^T Q (softmax scale 1)
    swa: bool = False  # reads <arch>.attention.sliding_window (+ pattern, rope.freq_base_swa)
    softcap: bool = False  # reads <arch>.final_logit_softcapping
    swa_pattern: int = 6  # llama.cpp's default pattern: the last of every n layers is global


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (
        Architecture("llama"),
        Architecture("qwen2", rope_type=ROPE_NEOX),
        Architecture("qwen3", rope_type=ROPE_NEOX, qk_norm=True),
        Architecture("gemma3", rope_type=ROPE_NEOX, qk_norm=True, post_norms=True,
                     embd_scale=True, ffn_gelu=True, scale_q=True, swa=True, softcap=True),
    )}


def architecture(name: object, where: str) -> Architecture:
    """The :class:`Architecture` called ``name``; ShapeError naming it when ggopt has none."""
    arch = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        known = ", ".join(repr(n) for n in ARCHITECTURES)
        raise ShapeError(f"{where}: general.architecture {name!r} is not supported (ggopt runs "
                         f"{known})")
    return arch
