"""Writing small llama GGUFs the way converters do (keys of any type, tensors of any type), for
the loader and generation tests. Weights come from :func:`llm_ref.random_weights`."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFEndian, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from ggopt.models import llama
from tests.support.llm_ref import random_weights

Q = GGMLQuantizationType
V = GGUFValueType
_KQUANT_SCALES = {  # byte offsets of the f16 super-block scales (d, dmin) in each K-quant block
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def keys(cfg: llama.Config) -> dict[str, tuple[object, GGUFValueType]]:
    """llama.cpp's keys for ``cfg`` (under its architecture's prefix) in their required
    types."""
    a = cfg.arch
    out = _family_keys(cfg)
    return out | {f"{a}.context_length": (cfg.n_ctx, V.UINT32),
            f"{a}.embedding_length": (cfg.n_embd, V.UINT32),
            f"{a}.block_count": (cfg.n_layer, V.UINT32),
            f"{a}.feed_forward_length": (cfg.n_ff, V.UINT32),
            f"{a}.attention.head_count": (cfg.n_head, V.UINT32),
            f"{a}.attention.head_count_kv": (cfg.n_head_kv, V.UINT32),
            f"{a}.attention.layer_norm_rms_epsilon": (cfg.eps, V.FLOAT32),
            f"{a}.rope.freq_base": (cfg.freq_base, V.FLOAT32),
            f"{a}.vocab_size": (cfg.n_vocab, V.UINT32)}


def _family_keys(cfg: llama.Config) -> dict[str, tuple[object, GGUFValueType]]:
    a, out = cfg.arch, {}
    if cfg.n_embd_head:
        out[f"{a}.attention.key_length"] = (cfg.n_embd_head, V.UINT32)
        out[f"{a}.attention.value_length"] = (cfg.n_embd_head, V.UINT32)
    if cfg.n_swa:
        out[f"{a}.attention.sliding_window"] = (cfg.n_swa, V.UINT32)
        out[f"{a}.rope.freq_base_swa"] = (cfg.freq_base_swa, V.FLOAT32)
        n = next((n for n in range(1, cfg.n_layer + 1) if cfg.swa_layers == tuple(
            i % n < n - 1 for i in range(cfg.n_layer))), None)
        if n != 6:
            out[f"{a}.attention.sliding_window_pattern"] = (n, V.UINT32)
    if cfg.softcap:
        out[f"{a}.final_logit_softcapping"] = (cfg.softcap, V.FLOAT32)
    return out


def encode(arr: np.ndarray, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """``arr`` (float32) stored as ``qtype``: quantized where the gguf package can, else
    (K-quants) random blocks with small finite scales."""
    if qtype == Q.F32:
        return arr
    if qtype == Q.F16:
        return arr.astype(np.float16)
    if qtype in _KQUANT_SCALES:
        block, size = GGML_QUANT_SIZES[qtype]
        rows = arr.reshape(-1, arr.shape[-1])
        nblocks = rows.shape[1] // block
        raw = rng.integers(0, 256, (rows.shape[0], nblocks, size), dtype=np.uint8)
        for off in _KQUANT_SCALES[qtype]:
            raw[:, :, off:off + 2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
        return raw.reshape(rows.shape[0], nblocks * size)
    return quantize(arr, qtype)


def write(path: object, cfg: llama.Config, *, weights: dict[str, np.ndarray] | None = None,
          types: dict[str, GGMLQuantizationType] | None = None,
          key_overrides: dict[str, tuple[object, GGUFValueType] | None] | None = None,
          drop: tuple[str, ...] = (), extra: dict[str, np.ndarray] | None = None,
          arch: str | None = None, seed: int = 7,
          big_endian: bool = False) -> dict[str, np.ndarray]:
    """Write a llama GGUF with ggopt's byte vocabulary; return the weights as llama.cpp sees
    them (dequantized), in NumPy order. ``types``: per-tensor storage types (default F32);
    ``key_overrides``: replace a key (None removes it); ``drop``: tensors left out."""
    w = weights or random_weights(llama.param_shapes(cfg), seed)
    rng = np.random.default_rng(seed)
    kv = keys(cfg)
    for key, value in (key_overrides or {}).items():
        if value is None:
            kv.pop(key, None)
        else:
            kv[key] = value
    writer = GGUFWriter(str(path), arch or cfg.arch,
                        endianess=GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE)
    for key, (value, vtype) in kv.items():
        if vtype == V.ARRAY:
            sub = V.BOOL if all(isinstance(v, bool) for v in value) else V.UINT32
            writer.add_key_value(key, value, V.ARRAY, sub)
        else:
            writer.add_key_value(key, value, vtype)
    writer.add_key_value("tokenizer.ggml.model", "rwkv", V.STRING)
    writer.add_key_value("tokenizer.ggml.tokens", llama.byte_tokens(), V.ARRAY, V.STRING)
    seen = {}
    for name, arr in {**w, **(extra or {})}.items():
        if name in drop:
            continue
        qtype = (types or {}).get(name, Q.F32)
        data = encode(arr, qtype, rng)
        writer.add_tensor(name, data, raw_shape=None if qtype in (Q.F32, Q.F16) else
                          data.shape, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        seen[name] = arr if qtype == Q.F32 else \
            dequantize(data, qtype).astype(np.float32).reshape(arr.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return seen
