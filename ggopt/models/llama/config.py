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
from .arch import ARCHITECTURES, Architecture, architecture

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
    """Hyper-parameters (llama.cpp's ``<arch>.*`` GGUF keys).

    ``arch``: the family (:data:`.arch.ARCHITECTURES`); ``n_embd_head``: the head size
    (``<arch>.attention.key_length``; 0: ``n_embd / n_head``); ``freq_scale`` is llama.cpp's
    ``rope_freq_scale`` (1 / linear scaling factor); ``attn_scale`` the scale of ``K^T Q``
    (0: ``1/sqrt(head_dim)``); ``tied_output``: no ``output.weight``, the output projection
    is ``token_embd.weight``; ``rope_freqs``: a ``rope_freqs.weight`` of ``head_dim/2``
    frequency factors divides the rope angles; ``qkv_bias``: ``attn_q/k/v.bias`` are added;
    ``n_swa``: the sliding window of the layers flagged in ``swa_layers`` (a key at position
    ``p0`` is hidden from a query at ``p1`` when ``p1 - p0 >= n_swa``), whose rope base is
    ``freq_base_swa``; ``softcap``: final logits ``c * tanh(logits / c)`` (0: off).
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
    arch: str = ARCH
    n_embd_head: int = 0
    qkv_bias: bool = False
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    freq_base_swa: float = 10000.0
    softcap: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ShapeError(f"llm config: unknown architecture {self.arch!r} (ggopt runs "
                             f"{', '.join(ARCHITECTURES)})")
        for name in ("n_ctx", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShapeError(f"llm config: {name} must be a positive int, got {v!r}")
        head = self.n_embd_head
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or head < 0:
            raise ShapeError(f"llm config: n_embd_head must be an int >= 0, got {head!r}")
        if not head and self.n_embd % self.n_head:
            raise ShapeError(f"llm config: the {self.n_head} heads must divide n_embd="
                             f"{self.n_embd} (head size n_embd/n_head)")
        if self.n_head % self.n_head_kv:
            raise ShapeError(f"llm config: the {self.n_head_kv} KV heads must divide the "
                             f"{self.n_head} query heads (grouped-query attention)")
        if self.head_dim % 2:
            raise ShapeError(f"llm config: the head size {self.head_dim} must be even (rope "
                             f"turns pairs of dimensions)")
        if self.swa_layers and len(self.swa_layers) != self.n_layer:
            raise ShapeError(f"llm config: swa_layers flags {len(self.swa_layers)} layers, the "
                             f"model has {self.n_layer}")
        if any(self.swa_layers) and (isinstance(self.n_swa, bool) or self.n_swa < 1):
            raise ShapeError(f"llm config: sliding-window layers need a window n_swa >= 1, got "
                             f"{self.n_swa!r}")
        for name in ("eps", "freq_base", "freq_scale", "freq_base_swa"):
            v = getattr(self, name)
            if not (isinstance(v, (float, int)) and math.isfinite(v) and v > 0):
                raise ShapeError(f"llm config: {name} must be a finite number > 0, got {v!r}")
        if not (math.isfinite(self.attn_scale) and self.attn_scale >= 0):
            raise ShapeError(f"llm config: attn_scale must be finite and >= 0, got "
                             f"{self.attn_scale!r}")
        if not (math.isfinite(self.softcap) and self.softcap >= 0):
            raise ShapeError(f"llm config: softcap must be finite and >= 0, got "
                             f"{self.softcap!r}")

    @property
    def family(self) -> Architecture:
        return ARCHITECTURES[self.arch]

    @property
    def head_dim(self) -> int:
        return self.n_embd_head or self.n_embd // self.n_head

    @property
    def n_embd_q(self) -> int:
        return self.head_dim * self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    def is_swa(self, layer: int) -> bool:
        """Layer ``layer`` attends through the sliding window."""
        return bool(self.swa_layers) and self.swa_layers[layer]

    def layer_freq_base(self, layer: int) -> float:
        """The rope base of layer ``layer`` (``freq_base_swa`` on sliding-window layers)."""
        return self.freq_base_swa if self.is_swa(layer) else self.freq_base

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


def _rope_scale(fields: Mapping[str, Any], a: str, where: str) -> float:
    """llama.cpp's ``rope_freq_scale_train``: 1/factor for linear scaling (the default type),
    1 without a factor; YaRN and LongRoPE are refused."""
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


def _swa_layers(fields: Mapping[str, Any], a: str, n_layer: int, pattern: int,
                where: str) -> tuple[bool, ...]:
    """llama.cpp's ``load_swa_pattern``: ``<a>.attention.sliding_window_pattern`` as a
    per-layer bool array, or a u32 ``n`` (default ``pattern``): layer ``i`` is a
    sliding-window layer when ``i % n < n - 1`` (every layer when ``n`` is 0)."""
    key = f"{a}.attention.sliding_window_pattern"
    field = fields.get(key)
    if field is not None and list(field.types) == [_V.ARRAY, _V.BOOL]:
        flags = tuple(bool(v) for v in field.contents())
        if len(flags) != n_layer:
            raise ShapeError(f"{where}: key {key} flags {len(flags)} layers, the model has "
                             f"{n_layer}")
        return flags
    n = field_value(fields, key, _V.UINT32, where)
    n = pattern if n is None else int(n)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def config_from_fields(fields: Mapping[str, Any], n_tokens: int | None, tied_output: bool,
                       rope_freqs: bool, where: str, qkv_bias: bool = False) -> Config:
    """The :class:`Config` of a GGUF's key-value ``fields`` (``GGUFReader.fields``) for any
    architecture of :data:`.arch.ARCHITECTURES` (its keys read under its own prefix).

    ``n_tokens``: the length of ``tokenizer.ggml.tokens`` (the vocabulary size when
    ``<arch>.vocab_size`` is absent). Raises DTypeError for a key of the wrong type, ShapeError
    or InvalidValueError for a missing key, an unknown architecture or a value out of range.
    """
    name = field_value(fields, "general.architecture", _V.STRING, where)
    family = architecture(name, where)
    a = family.name

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
    key_length = u32("attention.key_length", False)
    if key_length is None and (n_head == 0 or n_embd % n_head):
        raise ShapeError(f"{where}: {a}.attention.head_count = {n_head} must divide "
                         f"{a}.embedding_length = {n_embd}")
    if key_length is not None and (key_length == 0 or key_length % 2):
        raise ShapeError(f"{where}: key {a}.attention.key_length = {key_length}: the head "
                         f"size must be even and > 0")
    head_dim = key_length or n_embd // n_head
    for key in ("rope.dimension_count", "attention.value_length"):
        value = u32(key, False)
        if value is not None and value != head_dim:
            raise ShapeError(f"{where}: key {a}.{key} = {value}: ggopt needs the head size "
                             f"{head_dim} (full rope, equal K/V heads)")
    attn_scale = f32("attention.scale", 0.0)
    n_swa, freq_base_swa, softcap = 0, 10000.0, 0.0
    swa_layers: tuple[bool, ...] = ()
    if family.scale_q:  # gemma3: llama.cpp sets the scale itself (the key is not read)
        dim = n_embd // n_head if n_layer == 62 else head_dim
        attn_scale = float(np.float32(1.0) / np.sqrt(np.float32(dim)))
    if family.swa:
        n_swa = u32("attention.sliding_window", False)
        if n_swa == 0:
            raise ShapeError(f"{where}: key {a}.attention.sliding_window = 0: a sliding "
                             f"window must hold at least one token")
        n_swa = n_swa or 0
        if n_swa:
            swa_layers = _swa_layers(fields, a, n_layer, family.swa_pattern, where)
            freq_base_swa = f32("rope.freq_base_swa", 10000.0)
    if family.softcap:
        softcap = f32("final_logit_softcapping", 0.0)
    try:
        return Config(n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                      n_head_kv=n_head if n_head_kv is None else n_head_kv, n_ff=n_ff,
                      n_vocab=vocab, eps=f32("attention.layer_norm_rms_epsilon"),
                      freq_base=f32("rope.freq_base", 10000.0),
                      freq_scale=_rope_scale(fields, a, where),
                      attn_scale=attn_scale, tied_output=tied_output, rope_freqs=rope_freqs,
                      arch=a, n_embd_head=key_length or 0, qkv_bias=qkv_bias, n_swa=n_swa,
                      swa_layers=swa_layers, freq_base_swa=freq_base_swa, softcap=softcap)
    except ShapeError as exc:
        raise ShapeError(f"{where}: {exc}") from None
