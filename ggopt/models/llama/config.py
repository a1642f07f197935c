"""A llama model's hyper-parameters, and reading them from GGUF keys with llama.cpp's types.

llama.cpp's loader (``llama_model_loader::get_key``) accepts a key only in its exact GGUF type:
lengths and counts are UINT32, the epsilon, rope base and scales FLOAT32, the rope scaling type
a STRING. :func:`config_from_fields` enforces the same types and says which key had which type
when one is wrong, then checks the values (finite, positive, consistent).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ...errors import DTypeError, InvalidValueError, ShapeError

__all__ = ["ARCH", "N_VOCAB_BYTES", "Config", "config_from_fields", "field_value"]

ARCH = "llama"
N_VOCAB_BYTES = 256  # ggopt's byte-level models
_V = GGUFValueType
_TYPE_NAMES = {t: t.name.lower().replace("int", "i").replace("uint", "u") for t in _V}
_TYPE_NAMES.update({_V.UINT32: "u32", _V.INT32: "i32", _V.FLOAT32: "f32", _V.FLOAT64: "f64",
                    _V.UINT64: "u64", _V.INT64: "i64", _V.UINT8: "u8", _V.INT8: "i8",
                    _V.UINT16: "u16", _V.INT16: "i16", _V.BOOL: "bool", _V.STRING: "str",
                    _V.ARRAY: "arr"})


@dataclasses.dataclass(frozen=True)
class Config:
    """Hyper-parameters (llama.cpp's ``llama.*`` GGUF keys).

    ``freq_scale`` is llama.cpp's ``rope_freq_scale`` (1 / linear scaling factor);
    ``attn_scale`` the scale of ``K^T Q`` (0: ``1/sqrt(head_dim)``); ``tied_output``: no
    ``output.weight``, the output projection is ``token_embd.weight``; ``rope_freqs``: a
    ``rope_freqs.weight`` of ``head_dim/2`` frequency factors divides the rope angles.
    """

    n_ctx: int = 128
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 384
    n_vocab: int = N_VOCAB_BYTES
    eps: float = 1e-5
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    attn_scale: float = 0.0
    tied_output: bool = False
    rope_freqs: bool = False

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShapeError(f"llm config: {name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ShapeError(f"llm config: the {self.n_head} heads must divide n_embd="
                             f"{self.n_embd} (head size n_embd/n_head)")
        if self.n_head % self.n_head_kv:
            raise ShapeError(f"llm config: the {self.n_head_kv} KV heads must divide the "
                             f"{self.n_head} query heads (grouped-query attention)")
        if self.head_dim % 2:
            raise ShapeError(f"llm config: the head size n_embd/n_head={self.head_dim} must be "
                             f"even (rope turns pairs of dimensions)")
        for name in ("eps", "freq_base", "freq_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (float, int)) and math.isfinite(v) and v > 0):
                raise ShapeError(f"llm config: {name} must be a finite number > 0, got {v!r}")
        if not (math.isfinite(self.attn_scale) and self.attn_scale >= 0):
            raise ShapeError(f"llm config: attn_scale must be finite and >= 0, got "
                             f"{self.attn_scale!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)


def _type_name(types: list[GGUFValueType]) -> str:
    if types and types[0] == _V.ARRAY:
        return f"arr[{_TYPE_NAMES[types[-1]]}]" if len(types) > 1 else "arr"
    return _TYPE_NAMES[types[0]] if types else "?"


def field_value(fields: Mapping[str, Any], key: str, vtype: GGUFValueType,
                where: str) -> Any:
    """The value of GGUF key ``key`` (a ``GGUFReader`` field) if it has type ``vtype``;
    None when absent; DTypeError naming the key and both types otherwise."""
    field = fields.get(key)
    if field is None:
        return None
    if list(field.types) != [vtype]:
        raise DTypeError(f"{where}: key {key} has type {_type_name(list(field.types))}, "
                         f"expected {_TYPE_NAMES[vtype]}")
    value = field.contents()
    if vtype == _V.FLOAT32:
        return float(str(np.float32(value)))  # 1e-05, not 9.99999974e-06
    return value


def _u32_or_array(fields: Mapping[str, Any], key: str, n_layer: int, where: str) -> Any:
    """llama.cpp's ``get_key_or_arr``: a u32, or a per-layer array (ggopt: all equal)."""
    field = fields.get(key)
    if field is None or list(field.types) == [_V.UINT32]:
        return field_value(fields, key, _V.UINT32, where)
    types = list(field.types)
    if types[0] != _V.ARRAY or types[-1] not in (_V.UINT32, _V.INT32):
        raise DTypeError(f"{where}: key {key} has type {_type_name(types)}, expected u32 "
                         f"or a per-layer arr[u32]")
    values = [int(v) for v in field.contents()]
    if len(values) != n_layer or len(set(values)) != 1:
        raise ShapeError(f"{where}: key {key}: per-layer values {values[:8]} (ggopt needs one "
                         f"value for all {n_layer} layers)")
    return values[0]


def _require(value: Any, key: str, where: str) -> Any:
    if value is None:
        raise ShapeError(f"{where}: missing key {key}")
    return value


def _rope_scale(fields: Mapping[str, Any], where: str) -> float:
    """llama.cpp's ``rope_freq_scale_train``: 1/factor for linear scaling (the default type),
    1 without a factor; YaRN and LongRoPE are refused."""
    a = ARCH
    kind = field_value(fields, f"{a}.rope.scaling.type", _V.STRING, where)
    factor = field_value(fields, f"{a}.rope.scaling.factor", _V.FLOAT32, where)
    if factor is None or factor == 0.0:
        factor = field_value(fields, f"{a}.rope.scale_linear", _V.FLOAT32, where)
    if kind not in (None, "linear", "none"):
        raise InvalidValueError(f"{where}: key {a}.rope.scaling.type = {kind!r}: ggopt "
                                f"supports 'linear' and 'none' rope scaling")
    if factor is None or factor == 0.0:
        return 1.0
    factor = float(factor)
    if not (math.isfinite(factor) and factor > 0):
        raise InvalidValueError(f"{where}: key {a}.rope.scaling.factor = {factor}: expected a "
                                f"finite number > 0")
    if kind == "none" and factor != 1.0:
        raise InvalidValueError(f"{where}: rope.scaling.type 'none' with factor {factor}")
    return 1.0 / factor


def config_from_fields(fields: Mapping[str, Any], n_tokens: int | None, tied_output: bool,
                       rope_freqs: bool, where: str) -> Config:
    """The :class:`Config` of a llama GGUF's key-value ``fields`` (``GGUFReader.fields``).

    ``n_tokens``: the length of ``tokenizer.ggml.tokens`` (the vocabulary size when
    ``llama.vocab_size`` is absent). Raises DTypeError for a key of the wrong type, ShapeError
    or InvalidValueError for a missing key or a value out of range.
    """
    a = ARCH
    arch = field_value(fields, "general.architecture", _V.STRING, where)
    if arch != ARCH:
        raise ShapeError(f"{where}: general.architecture: expected {ARCH!r}, got {arch!r}")

    def u32(key: str, required: bool = True) -> Any:
        value = field_value(fields, f"{a}.{key}", _V.UINT32, where)
        return _require(value, f"{a}.{key}", where) if required else value

    def f32(key: str, default: float | None = None) -> Any:
        value = field_value(fields, f"{a}.{key}", _V.FLOAT32, where)
        value = default if value is None else value
        value = _require(value, f"{a}.{key}", where)
        if not math.isfinite(value):
            raise InvalidValueError(f"{where}: key {a}.{key} = {value}: expected a finite f32")
        return value

    n_layer = u32("block_count")
    n_embd = u32("embedding_length")
    n_head = _require(_u32_or_array(fields, f"{a}.attention.head_count", n_layer, where),
                      f"{a}.attention.head_count", where)
    n_head_kv = _u32_or_array(fields, f"{a}.attention.head_count_kv", n_layer, where)
    n_ff = _require(_u32_or_array(fields, f"{a}.feed_forward_length", n_layer, where),
                    f"{a}.feed_forward_length", where)
    n_ctx = u32("context_length")
    expert_count = u32("expert_count", False)
    if expert_count:
        raise InvalidValueError(f"{where}: key {a}.expert_count = {expert_count}: mixture of "
                                f"experts is not supported")
    vocab = u32("vocab_size", False)
    if vocab is None:
        if n_tokens is None:
            raise ShapeError(f"{where}: neither {a}.vocab_size nor tokenizer.ggml.tokens")
        vocab = n_tokens
    if n_head == 0 or n_embd % n_head:
        raise ShapeError(f"{where}: {a}.attention.head_count = {n_head} must divide "
                         f"{a}.embedding_length = {n_embd}")
    head_dim = n_embd // n_head
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = u32(key, False)
        if value is not None and value != head_dim:
            raise ShapeError(f"{where}: key {a}.{key} = {value}: ggopt needs the head size "
                             f"n_embd/n_head = {head_dim} (full rope, equal K/V heads)")
    try:
        return Config(n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                      n_head_kv=n_head if n_head_kv is None else n_head_kv, n_ff=n_ff,
                      n_vocab=vocab, eps=f32("attention.layer_norm_rms_epsilon"),
                      freq_base=f32("rope.freq_base", 10000.0),
                      freq_scale=_rope_scale(fields, where),
                      attn_scale=f32("attention.scale", 0.0),
                      tied_output=tied_output, rope_freqs=rope_freqs)
    except ShapeError as exc:
        raise ShapeError(f"{where}: {exc}") from None
