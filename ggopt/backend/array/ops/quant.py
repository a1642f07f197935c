"""The reference for nodes with a quantized source. mul_mat: ggml's integer product
(:func:`int_product`: the activations rounded to the weight type's vec_dot_type, integer
block sums, then the scales), in NumPy on the host. out_prod and get_rows: dequantize with
``gguf.quants`` (NumPy; the package's checked port of ggml's C), then the F32 array code.
Quantizing (cpy from F32 to a quantized type) uses ``gguf.quants.quantize`` likewise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....tensor import Tensor

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def dequantized(be: ArrayBackend, t: Tensor, raw: Any) -> Any:
    """The float32 ``xp`` array of the quantized tensor ``t`` whose raw blocks are ``raw``
    (4-D, ``(ne3, ne2, ne1, row bytes)``)."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    host = np.ascontiguousarray(be.to_host(raw))
    values = quants.dequantize(host, GGMLQuantizationType(int(t.type)))
    return be.xp.asarray(values.astype(np.float32, copy=False))


def quantized(be: ArrayBackend, t: Tensor, values: Any) -> Any:
    """The raw blocks (``xp`` uint8) of float32 ``values`` as ``t``'s quantized type."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    host = np.ascontiguousarray(be.to_host(values), dtype=np.float32)
    return be.xp.asarray(quants.quantize(host, GGMLQuantizationType(int(t.type))))


# ggml's integer products of a quantized weight, in NumPy: the activations rounded to the
# weight type's vec_dot_type as ggml's x86 quantize_row_q8_0/q8_1/q8_K do, the exact integer
# sum of each block, then acc = acc + (dw * da) * isum [+ mw * s | - (dmin * da) * msum],
# block after block, in float32 (the order _kernels/_quant_dot.h fixes).

_F = np.float32
#: weight type code -> (vec_dot_type name, elements per block)
VEC_DOT_TYPES = {2: ("Q8_0", 32), 6: ("Q8_0", 32), 8: ("Q8_0", 32), 3: ("Q8_1", 32),
                 7: ("Q8_1", 32), **{t: ("Q8_K", 256) for t in (10, 11, 12, 13, 14)}}


def _maxps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x86's max_ps: ``a`` where ``a > b``, else ``b`` (``b`` when either is NaN)."""
    return np.where(a > b, a, b)


def _f16(v: np.ndarray) -> np.ndarray:
    """float32 rounded to F16 (nearest even) and back."""
    with np.errstate(over="ignore", invalid="ignore"):
        return v.astype(np.float16).astype(_F)


def q8_32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's x86 ``quantize_row_q8_0``/``q8_1`` of float32 ``x`` (..., 32): int8 codes,
    the F16 d (as float32) and Q8_1's F16 s = d * (sum of the unsaturated codes)."""
    ax = np.abs(x)
    m = ax[..., 0:8]
    for at in (8, 16, 24):
        m = _maxps(m, ax[..., at:at + 8])
    m4 = _maxps(m[..., 4:8], m[..., 0:4])
    amax = _maxps(_maxps(m4[..., 0], m4[..., 2]), _maxps(m4[..., 1], m4[..., 3]))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = amax / _F(127)
        inv = np.where(amax != 0, _F(127) / np.where(amax != 0, amax, _F(1)), _F(0)).astype(_F)
        r = np.rint(x * inv[..., None])
    ok = (r >= -2.0 ** 31) & (r < 2.0 ** 31)
    i = np.where(ok, np.where(ok, r, 0).astype(np.int64), -2 ** 31)
    total = (i.sum(axis=-1) + 2 ** 31) % 2 ** 32 - 2 ** 31  # int32 wrap-around
    with np.errstate(over="ignore", invalid="ignore"):
        s = _f16(d * total.astype(_F))
    return np.clip(i, -128, 127).astype(np.int8), _f16(d), s


def q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``quantize_row_q8_K`` of float32 ``x`` (..., 256): int8 codes and the F32 d.
    The element of largest magnitude (the first; NaN never counts) maps to -127."""
    ax = np.abs(x)
    ax = np.where(np.isnan(ax), _F(-1), ax)
    first = np.argmax(ax, axis=-1)
    amax = np.take_along_axis(ax, first[..., None], -1)[..., 0]
    big = np.take_along_axis(x, first[..., None], -1)[..., 0]
    live = amax > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(live, _F(-127) / np.where(live, big, _F(1)), _F(0)).astype(_F)
        v = (iscale[..., None] * x + _F(12582912)).astype(_F)
        d = np.where(live, _F(1) / np.where(live, iscale, _F(1)), _F(0)).astype(_F)
    q = (v.view(np.int32) & 0x7FFFFF) - 0x400000
    q = np.where(live[..., None], np.minimum(q, 127), 0)
    return q.astype(np.int8), d


def q8_activations(x: np.ndarray, qtype: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The rows of float32 ``x`` (N, K) as weight type ``qtype``'s vec_dot_type:
    codes (N, blocks, block), d (N, blocks), Q8_1's s (N, blocks) or None."""
    name, qb = VEC_DOT_TYPES[qtype]
    xb = np.ascontiguousarray(x, dtype=_F).reshape(x.shape[0], -1, qb)
    if name == "Q8_K":
        q, d = q8_k(xb)
        return q, d, None
    q, d, s = q8_32(xb)
    return q, d, s if name == "Q8_1" else None


def _f16_at(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(_F)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    h = np.ascontiguousarray(qh).view(np.uint32)[..., 0].astype(np.int64)
    return ((h[..., None] >> np.arange(32)) & 1) << 4


def weight_codes(raw: np.ndarray, qtype: int) -> dict[str, np.ndarray]:
    """The integer codes (M, blocks, block; offsets removed: code - 8 for Q4_0, - 16 for
    Q5_0, - 4 for Q3_K, - 32 for Q6_K) and the scales of the raw weight rows (M, row bytes) of
    a type of :data:`VEC_DOT_TYPES`."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    qb, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    b = raw.reshape(raw.shape[0], -1, size)
    out: dict[str, np.ndarray] = {}
    if qtype == 8:
        return {"q": b[..., 2:].view(np.int8).astype(np.int64), "d": _f16_at(b, 0)}
    if qtype in (2, 3):
        q = _nibbles(b[..., 2 if qtype == 2 else 4:])
        out = {"q": q - 8 if qtype == 2 else q, "d": _f16_at(b, 0)}
    elif qtype in (6, 7):
        lo = 2 if qtype == 6 else 4
        q = _nibbles(b[..., lo + 4:]) | _fifth_bits(b[..., lo:lo + 4])
        out = {"q": q - 16 if qtype == 6 else q, "d": _f16_at(b, 0)}
    elif qtype in (12, 13):  # Q4_K; Q5_K: bit j of qh[l] is code 32 * j + l's fifth bit
        sc, mn = _q4_k_scales(b[..., 4:16])
        at = 16 if qtype == 12 else 48
        q = np.concatenate([_nibbles(b[..., at + 32 * g:at + 32 + 32 * g]) for g in range(4)], -1)
        if qtype == 13:
            qh = b[..., 16:48].astype(np.int64)
            q = q | (((qh[..., None, :] >> np.arange(8)[:, None]) & 1) << 4).reshape(q.shape)
        out = {"q": q, "d": _f16_at(b, 0), "dmin": _f16_at(b, 2), "sc": sc, "mn": mn}
    elif qtype in (10, 11):  # Q2_K; Q3_K: minus 4 unless hmask's bit e / 32 of byte e % 32
        qs = b[..., 16:80] if qtype == 10 else b[..., 32:96]
        pairs = qs.astype(np.int64).reshape(*qs.shape[:-1], 2, 1, 32)
        q = ((pairs >> (2 * np.arange(4))[:, None]) & 3).reshape(*qs.shape[:-1], 256)
        if qtype == 10:
            s = b[..., :16].astype(np.int64)
            out = {"q": q, "d": _f16_at(b, 80), "dmin": _f16_at(b, 82), "sc": s & 15,
                   "mn": s >> 4}
        else:
            hm = b[..., :32].astype(np.int64)
            hbit = ((hm[..., None, :] >> np.arange(8)[:, None]) & 1).reshape(q.shape)
            out = {"q": q - 4 * (1 - hbit), "d": _f16_at(b, 108),
                   "sc": _q3_k_scales(b[..., 96:108])}
    elif qtype == 14:
        ql, qh = b[..., :128].astype(np.int64), b[..., 128:192].astype(np.int64)
        parts = []
        for h in range(2):
            for qq in range(4):
                low = ql[..., 64 * h + (qq & 1) * 32:][..., :32] >> (4 * (qq >> 1)) & 0x0F
                parts.append(low | (qh[..., 32 * h:32 * h + 32] >> (2 * qq) & 3) << 4)
        out = {"q": np.concatenate(parts, -1) - 32, "d": _f16_at(b, 208),
               "sc": b[..., 192:208].view(np.int8).astype(np.int64)}
    if qtype in (3, 7):
        out["m"] = _f16_at(b, 2)
    return out


def _q4_k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's eight 6-bit scales and minimums from its 12 packed bytes."""
    s = s.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], -1)
    return sc, mn


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's sixteen 6-bit scales minus 32 from its 12 packed bytes."""
    s = s.astype(np.int64)
    lo = np.concatenate([s[..., 0:8] & 15, s[..., 0:8] >> 4], -1)
    hi = np.concatenate([(s[..., 8:12] >> (2 * k)) & 3 for k in range(4)], -1)
    out: np.ndarray = (lo | hi << 4) - 32
    return out


def _isums(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact integer sums over the last axis for every (n, m): (N, M) int64 (float64
    products of small integers are exact)."""
    prod: np.ndarray = a.astype(np.float64) @ w.astype(np.float64).T
    out: np.ndarray = np.rint(prod).astype(np.int64)
    return out


def int_product(raw: np.ndarray, qtype: int, x: np.ndarray) -> np.ndarray:
    """``x @ W.T`` (N, M) float32 as ggml's CPU backend computes mul_mat of the quantized
    rows ``raw`` (M, row bytes) of type ``qtype`` with float32 ``x`` (N, K)."""
    qa, da, sa = q8_activations(x, qtype)
    w = weight_codes(np.ascontiguousarray(raw), qtype)
    n, m = x.shape[0], raw.shape[0]
    acc = np.zeros((n, m), dtype=_F)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite scales: NaN / inf
        return _combine(acc, qa, da, sa, w, qtype)


def _combine(acc: np.ndarray, qa: np.ndarray, da: np.ndarray, sa: np.ndarray | None,
             w: dict[str, np.ndarray], qtype: int) -> np.ndarray:
    """The blocks' terms added into ``acc`` in block order."""
    n = acc.shape[0]
    for blk in range(qa.shape[1]):
        a, q = qa[:, blk].astype(np.int64), w["q"][:, blk]
        t = w["d"][None, :, blk] * da[:, blk, None]
        if qtype in (12, 13):  # Q4_K, Q5_K: 8 scaled sums of 32, minus the minimums' term
            isum = sum(_isums(a[:, 32 * j:32 * j + 32], q[:, 32 * j:32 * j + 32])
                       * w["sc"][None, :, blk, j] for j in range(8))
            bs = a.reshape(n, 8, 32).sum(-1)
            msum = bs @ w["mn"][:, blk].T
            acc = acc + t * isum.astype(_F)
            acc = acc - (w["dmin"][None, :, blk] * da[:, blk, None]) * msum.astype(_F)
        elif qtype in (10, 11, 14):  # Q2_K, Q3_K, Q6_K: 16 scaled sums of 16 (Q2_K: minus
            # the minimums' term)
            isum = sum(_isums(a[:, 16 * j:16 * j + 16], q[:, 16 * j:16 * j + 16])
                       * w["sc"][None, :, blk, j] for j in range(16))
            acc = acc + t * isum.astype(_F)
            if qtype == 10:
                msum = a.reshape(n, 16, 16).sum(-1) @ w["mn"][:, blk].T
                acc = acc - (w["dmin"][None, :, blk] * da[:, blk, None]) * msum.astype(_F)
        else:
            acc = acc + t * _isums(a, q).astype(_F)
            if sa is not None:
                acc = acc + w["m"][None, :, blk] * sa[:, blk, None]
    return acc
