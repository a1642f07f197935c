"""float64 NumPy references for the transformer ops, written from ggml's definitions."""

from __future__ import annotations

import math

import numpy as np


def rope_angles(pos: np.ndarray, n_dims: int, freq_base: float = 10000.0,
                freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
                beta_fast: float = 32.0, beta_slow: float = 1.0, n_ctx_orig: int = 0,
                freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(angle, magnitude) of every (token, pair): shapes (n_tokens, n_dims/2) and scalar-like.

    theta_i = p * base^(-2i/n_dims) / ff_i; YaRN mixes interpolated (freq_scale * theta) and
    extrapolated angles with a ramp over the correction dims and scales the magnitude.
    """
    i = np.arange(n_dims // 2)
    extrap = pos.astype(np.float64)[:, None] * freq_base ** (-2.0 * i / n_dims)[None, :]
    if freq_factors is not None:
        extrap = extrap / freq_factors[: n_dims // 2].astype(np.float64)[None, :]
    interp = freq_scale * extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        def corr_dim(n_rot: float) -> float:
            return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

        low = max(0.0, math.floor(corr_dim(beta_fast)))
        high = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
        y = (i - low) / max(0.001, high - low)
        mix = (1 - np.clip(y, 0, 1)) * ext_factor
        theta = interp * (1 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        theta = interp
    return theta, mscale


def rope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, neox: bool = False, sign: float = 1.0,
             **kw) -> np.ndarray:
    """ggml's rope of ``x`` (NumPy order ``(..., n_tokens, n_head, head_dim)``); ``sign=-1``
    rotates backwards (rope_ext_back)."""
    theta, mscale = rope_angles(pos, n_dims, **kw)
    c = (np.cos(theta) * mscale)[:, None, :]
    s = (np.sin(theta) * mscale * sign)[:, None, :]
    x = x.astype(np.float64)
    out = x.copy()
    if neox:
        h = n_dims // 2
        x0, x1 = x[..., :h], x[..., h:n_dims]
        out[..., :h] = x0 * c - x1 * s
        out[..., h:n_dims] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * c - x1 * s
        out[..., 1:n_dims:2] = x0 * s + x1 * c
    return out


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's ALiBi slope per head (all ones when max_bias == 0)."""
    if max_bias <= 0:
        return np.ones(n_head)
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))


def soft_max_ext_ref(a: np.ndarray, mask: np.ndarray | None, scale: float,
                     max_bias: float) -> np.ndarray:
    """softmax(scale*a + slope*mask) along the last axis; ``a`` is 4-D NumPy order, the mask
    ``(m3, m2, >= rows, ne0)`` tiles dims 2/3 by modulo and uses its first rows."""
    a = a.astype(np.float64)
    x = scale * a
    if mask is not None:
        n3, n2, n1, _ = a.shape
        m = mask.astype(np.float64)[:, :, :n1, :]
        m = np.tile(m, (n3 // m.shape[0], n2 // m.shape[1], 1, 1))
        x = x + alibi_slopes(n2, max_bias)[None, :, None, None] * m
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def diag_mask_ref(a: np.ndarray, n_past: int, value: float) -> np.ndarray:
    """``a`` with element (row i1, column i0) set to ``value`` where i0 > n_past + i1."""
    out = a.astype(np.float64).copy()
    n1, n0 = a.shape[-2], a.shape[-1]
    cols, rows = np.meshgrid(np.arange(n0), np.arange(n1))
    out[..., cols > n_past + rows] = value
    return out
