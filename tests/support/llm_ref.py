"""A float64 NumPy forward of the byte-level llama (llama.cpp's math, written from its formulas):
the reference for ggopt's logits in tests/cli/test_llm.py and the interop test."""

from __future__ import annotations

import math

import numpy as np


def _norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """NORMAL rope of ``x`` (T, heads, hd): adjacent pairs turn by p * base^(-2i/hd)."""
    T, _, hd = x.shape
    theta = np.arange(T)[:, None] * base ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def logits(cfg, w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """Logits ``(T, n_vocab)`` of one sequence; ``w`` maps llama.cpp names to NumPy arrays."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T, H, Hkv, hd = len(tokens), cfg.n_head, cfg.n_head_kv, cfg.head_dim
    x = w["token_embd.weight"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        h = _norm(x, w[b + "attn_norm.weight"], cfg.eps)
        q = _rope((h @ w[b + "attn_q.weight"].T).reshape(T, H, hd), cfg.freq_base)
        k = _rope((h @ w[b + "attn_k.weight"].T).reshape(T, Hkv, hd), cfg.freq_base)
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, Hkv, hd)
        group = H // Hkv
        out = np.empty((T, H, hd))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh // group].T / math.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, hh // group]
        x = x + out.reshape(T, H * hd) @ w[b + "attn_output.weight"].T
        h = _norm(x, w[b + "ffn_norm.weight"], cfg.eps)
        gate = h @ w[b + "ffn_gate.weight"].T
        ff = gate * 0.5 * (1 + np.tanh(gate / 2)) * (h @ w[b + "ffn_up.weight"].T)  # silu
        x = x + ff @ w[b + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])  # tied when absent, as llama.cpp
    return _norm(x, w["output_norm.weight"], cfg.eps) @ out.T


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Weights large enough that attention and every block matter (unlike the 0.02 init):
    norms near 1, matrices with unit-variance outputs."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
    return out
