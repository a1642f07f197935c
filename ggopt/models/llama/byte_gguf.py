"""ggopt's own byte-level llama GGUF files, in llama.cpp's ``llama`` architecture.

Keys and types are the ones llama.cpp's loader requires (u32 lengths and counts, f32 epsilon and
rope base); the tokenizer is llama.cpp's ``rwkv`` model with the 256 byte tokens written as
lowercase ``\\xNN``, which llama.cpp tokenizes into exactly the byte values (any bytes, NUL and
invalid UTF-8 included) and detokenizes back. Tensors are F32 under llama.cpp's names.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from ...errors import ShapeError
from ...io.atomic import atomic_path
from .config import ARCH, N_VOCAB_BYTES, Config
from .graph import param_shapes

__all__ = ["byte_tokens", "save", "load"]

_U32 = GGUFValueType.UINT32
_F32 = GGUFValueType.FLOAT32


def byte_tokens() -> list[str]:
    """The 256 token strings of llama.cpp's ``rwkv`` tokenizer: ``"\\x00"`` ... ``"\\xff"``."""
    return [f"\\x{i:02x}" for i in range(N_VOCAB_BYTES)]


def _kvs(cfg: Config) -> list[tuple[str, object, GGUFValueType]]:
    a = ARCH
    return [
        (f"{a}.context_length", cfg.n_ctx, _U32),
        (f"{a}.embedding_length", cfg.n_embd, _U32),
        (f"{a}.block_count", cfg.n_layer, _U32),
        (f"{a}.feed_forward_length", cfg.n_ff, _U32),
        (f"{a}.rope.dimension_count", cfg.head_dim, _U32),
        (f"{a}.rope.freq_base", cfg.freq_base, _F32),
        (f"{a}.attention.head_count", cfg.n_head, _U32),
        (f"{a}.attention.head_count_kv", cfg.n_head_kv, _U32),
        (f"{a}.attention.layer_norm_rms_epsilon", cfg.eps, _F32),
        (f"{a}.vocab_size", cfg.n_vocab, _U32),
        ("general.file_type", 0, _U32),  # all F32
        ("tokenizer.ggml.model", "rwkv", GGUFValueType.STRING),
    ]


def save(path: str | os.PathLike[str], cfg: Config, weights: dict[str, np.ndarray],
         name: str = "ggopt byte-level llama") -> None:
    """Write ``weights`` (NumPy order, :func:`param_shapes`) and ``cfg`` as a llama GGUF.

    Everything is checked before the file is opened; the file is written atomically
    (:func:`ggopt.io.atomic.atomic_path`), so a failure never leaves a partial file.
    """
    spath = os.fspath(path)
    if cfg.n_vocab != N_VOCAB_BYTES or cfg.freq_scale != 1.0 or cfg.attn_scale:
        raise ShapeError(f"llm save {spath!r}: expected a byte-level model (256 tokens, no "
                         f"rope scaling)")
    for tname, shape in param_shapes(cfg).items():
        arr = weights.get(tname)
        if arr is None or arr.shape != shape or arr.dtype != np.float32:
            raise ShapeError(f"llm save {spath!r}: tensor {tname!r}: expected float32 of "
                             f"ggml shape {list(shape[::-1])}")
    with atomic_path(spath) as tmp:
        writer = GGUFWriter(tmp, ARCH)
        try:
            writer.add_name(name)
            for key, value, vtype in _kvs(cfg):
                writer.add_key_value(key, value, vtype)
            writer.add_key_value("tokenizer.ggml.tokens", byte_tokens(), GGUFValueType.ARRAY,
                                 GGUFValueType.STRING)
            writer.add_key_value("tokenizer.ggml.token_type", [1] * N_VOCAB_BYTES,
                                 GGUFValueType.ARRAY, GGUFValueType.INT32)
            for tname in param_shapes(cfg):
                writer.add_tensor(tname, np.ascontiguousarray(weights[tname]))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def load(path: str | os.PathLike[str]) -> tuple[Config, dict[str, np.ndarray]]:
    """Read a byte-level llama GGUF (written by :func:`save`): its config and F32 weights.

    Raises
    ------
    GgoptError
        As :func:`ggopt.models.llama.read_weights`, or a vocabulary other than the 256 byte
        tokens (ShapeError).
    """
    from .loader import read_weights

    cfg, weights, reader = read_weights(path)
    field = reader.fields.get("tokenizer.ggml.tokens")
    tokens = None if field is None else field.contents()
    model_field = reader.fields.get("tokenizer.ggml.model")
    kind = None if model_field is None else model_field.contents()
    if cfg.n_vocab != N_VOCAB_BYTES or tokens != byte_tokens() or kind != "rwkv":
        raise ShapeError(f"llm load {os.fspath(path)!r}: expected the byte-level vocabulary "
                         f"(256 tokens \\x00 .. \\xff, rwkv tokenizer)")
    if cfg.tied_output:  # ggopt's own files always store output.weight
        weights["output.weight"] = weights["token_embd.weight"]
        cfg = dataclasses.replace(cfg, tied_output=False)
    return cfg, weights
