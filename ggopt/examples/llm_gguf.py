"""GGUF files of the llama example in llama.cpp's ``llama`` architecture.

Keys and types are the ones llama.cpp's loader requires (u32 lengths and counts, f32 epsilon and
rope base); the tokenizer is llama.cpp's ``rwkv`` model with the 256 byte tokens written as
lowercase ``\\xNN``, which llama.cpp tokenizes into exactly the byte values (any bytes, NUL and
invalid UTF-8 included) and detokenizes back. Tensors are F32 under llama.cpp's names.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from ..errors import GgoptError, ShapeError
from ..io import gguf as ggopt_gguf
from ..io.atomic import atomic_path
from .llm_model import N_VOCAB, Config, param_shapes

__all__ = ["ARCH", "byte_tokens", "save", "load"]

ARCH = "llama"
_U32 = GGUFValueType.UINT32
_F32 = GGUFValueType.FLOAT32


def byte_tokens() -> list[str]:
    """The 256 token strings of llama.cpp's ``rwkv`` tokenizer: ``"\\x00"`` ... ``"\\xff"``."""
    return [f"\\x{i:02x}" for i in range(N_VOCAB)]


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
            writer.add_key_value("tokenizer.ggml.token_type", [1] * N_VOCAB,
                                 GGUFValueType.ARRAY, GGUFValueType.INT32)
            for tname in param_shapes(cfg):
                writer.add_tensor(tname, np.ascontiguousarray(weights[tname]))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()


def _f32(value: Any) -> float:
    """An f32 key as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def load(path: str | os.PathLike[str]) -> tuple[Config, dict[str, np.ndarray]]:
    """Read a llama GGUF written by :func:`save` (or any F32 byte-level llama file).

    Raises
    ------
    ShapeError
        Not GGUF, another architecture, a missing key, a vocabulary other than the 256 byte
        tokens, or tensors that do not match the hyper-parameters.
    """
    spath = os.fspath(path)
    where = f"llm load {spath!r}"
    meta, tensors = ggopt_gguf.load(spath)
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise ShapeError(f"{where}: general.architecture: expected {ARCH!r}, got {arch!r}")
    a = ARCH

    def get(key: str, default: object = None) -> Any:
        value = meta.get(f"{a}.{key}", default)
        if value is None:
            raise ShapeError(f"missing key {a}.{key}")
        return value

    try:
        n_embd, n_head = int(get("embedding_length")), int(get("attention.head_count"))
        cfg = Config(n_ctx=int(get("context_length")), n_embd=n_embd,
                     n_layer=int(get("block_count")), n_head=n_head,
                     n_head_kv=int(get("attention.head_count_kv", n_head)),
                     n_ff=int(get("feed_forward_length")),
                     n_vocab=int(get("vocab_size", N_VOCAB)),
                     eps=_f32(get("attention.layer_norm_rms_epsilon")),
                     freq_base=_f32(get("rope.freq_base", 10000.0)))
    except GgoptError as exc:
        raise ShapeError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{where}: a llama.* key of the wrong type ({exc})") from None
    rope_dim = meta.get(f"{a}.rope.dimension_count", cfg.head_dim)
    if rope_dim != cfg.head_dim:
        raise ShapeError(f"{where}: rope.dimension_count: expected the head size "
                         f"{cfg.head_dim} (full rope), got {rope_dim}")
    if cfg.n_vocab != N_VOCAB or meta.get("tokenizer.ggml.tokens") != byte_tokens():
        raise ShapeError(f"{where}: expected the byte-level vocabulary (256 tokens \\x00 .. "
                         f"\\xff, rwkv tokenizer)")
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        tensors["output.weight"] = tensors["token_embd.weight"]  # tied, as llama.cpp
    return cfg, tensors
