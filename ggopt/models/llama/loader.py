"""``load(path)``: a GGUF of any family of :mod:`.arch` (llama, qwen2, qwen3, gemma3) as a
ready model (weights in F32 on a backend, or with
``base_type="keep"`` as the file stores them, :mod:`.mapped`; its tokenizer).

Loading is a transaction: the keys (llama.cpp's types), the tensor list (names, ggml shapes,
types, sizes) and the vocabulary are all checked first; only then is memory allocated and each
tensor dequantized into it (or mapped). A failure on the way raises and leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, TextIO

import numpy as np
from gguf import GGUFValueType

from ..._kernels._ggml_order import QUANT_TYPES as GGML_ORDER_TYPES
from ...backend import Scheduler, cpu_init, tensor_set
from ...errors import DTypeError, GgoptError, InvalidValueError, ShapeError
from ...io.gguf_reader import GGUFFile
from ...io.paths import text_path
from .byte_gguf import byte_tokens
from .compute import check_compute_type
from .config import Config, config_from_fields, field_value
from .graph import LlamaModel, build_model, param_shapes
from .mapped import BASE_TYPES, map_model
from .vocab import Tokenizer, require, tokenizer_of
from .weights import ProgressBar, check_tensors, iter_f32, open_reader, tensor_table

__all__ = ["Model", "load", "read_config", "read_weights"]

#: Files larger than this show a progress bar while loading (unless told otherwise).
PROGRESS_BYTES = 64 << 20


@dataclasses.dataclass
class Model:
    """A loaded llama: hyper-parameters, weights on ``net.sched``'s backend, the tokenizer."""

    path: str
    cfg: Config
    net: LlamaModel
    tokenizer: Tokenizer | GgoptError  # the error when ggopt cannot tokenize for this file
    load_seconds: float
    tensor_types: dict[str, int]  # type name -> tensor count, as in the file
    is_bytes: bool  # ggopt's byte-level vocabulary (any bytes are tokens)
    base_type: str = "f32"  # "f32": dequantized, trainable; "keep": the file's types, frozen
    compute_type: str = "f32"  # "bf16": the matrices stored (or rounded per graph) in BF16

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or StateError saying why there is none."""
        return require(self.tokenizer, f"llm {self.path!r}")


def _n_tokens(reader: GGUFFile, where: str) -> int | None:
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        return None
    if list(field.types) != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
        raise GgoptError(f"{where}: key tokenizer.ggml.tokens must be an array of strings")
    return len(field.value)


def _is_bytes(reader: GGUFFile, where: str) -> bool:
    kind = field_value(reader.fields, "tokenizer.ggml.model", GGUFValueType.STRING, where)
    if kind != "rwkv" or _n_tokens(reader, where) != 256:
        return False
    field = reader.fields["tokenizer.ggml.tokens"]
    return list(field.value) == [t.encode() for t in byte_tokens()]


def read_config(reader: GGUFFile, where: str) -> tuple[Config, dict[str, Any]]:
    """The checked :class:`Config` and the tensor table (every tensor checked) of a file."""
    table = tensor_table(reader, where)
    n_tokens = _n_tokens(reader, where)
    cfg = config_from_fields(reader.fields, n_tokens,
                             tied_output="output.weight" not in table,
                             rope_freqs="rope_freqs.weight" in table, where=where,
                             qkv_bias="blk.0.attn_q.bias" in table)
    if n_tokens is not None and n_tokens != cfg.n_vocab:  # ids past the tokens: no text
        raise ShapeError(f"{where}: the vocabulary holds {n_tokens} tokens "
                         f"(tokenizer.ggml.tokens) but the model {cfg.n_vocab} "
                         f"({cfg.arch}.vocab_size, token_embd); they must agree")
    check_tensors(table, param_shapes(cfg), where)
    return cfg, table


def read_weights(path: str | os.PathLike[str]) -> tuple[Config, dict[str, np.ndarray],
                                                         GGUFFile]:
    """Every tensor of a llama GGUF as F32 NumPy arrays (NumPy order), with its config."""
    spath = text_path(path, "llm load")
    where = f"llm load {spath!r}"
    reader = open_reader(spath, where)
    cfg, table = read_config(reader, where)
    weights = dict(iter_f32(table, param_shapes(cfg), where))
    return cfg, weights, reader


def load(path: str | os.PathLike[str], sched: Scheduler | None = None, *,
         progress: bool | None = None, stream: TextIO | None = None,
         base_type: str = "f32", compute_type: str = "f32",
         ggml_order: bool | None = None) -> Model:
    """Load a GGUF of a family of :data:`.arch.ARCHITECTURES`, dispatched on
    ``general.architecture`` (any tensor type of :data:`weights.SUPPORTED_TYPES`).

    ``base_type``: ``"f32"`` (default) dequantizes every weight into F32 PARAM tensors;
    ``"keep"`` maps the matrices from the file as they are (F32, F16, BF16 and every block type;
    no copy, read-only, never PARAMs: for inference and LoRA) and dequantizes the norms
    (:mod:`.mapped`). ``compute_type="bf16"`` (:mod:`.compute`): the matrices that would be
    F32 are stored in BF16 (rounded once, here), frozen, and every product with a weight runs
    in BF16; a full fine-tune in BF16 loads F32 weights instead and rounds them per step
    (``FinetuneParams(compute_type="bf16")``). ``sched``: where the weights live (default: a
    new CPU scheduler).
    ``progress``: draw a progress bar on ``stream`` (default stderr); None = for files over
    64 MiB. ``ggml_order``: inference graphs in ggml's float order, llama.cpp's bits
    (:func:`.graph.build_graph`, docs/ggml-order.md); default: with ``base_type="keep"``
    when every matrix is Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or Q2_K ... Q6_K (with others it would
    not give llama.cpp's bits, only be slower).

    Raises
    ------
    GgoptError
        Not a readable GGUF (missing, truncated, damaged), another architecture, a key of the
        wrong type or value, a missing, unexpected or misshaped tensor, a tensor type ggopt
        does not load, a non-finite weight, an unknown ``base_type`` or ``compute_type``.
    """
    if base_type not in BASE_TYPES:
        raise InvalidValueError(f"llm load: base_type must be one of {', '.join(BASE_TYPES)}, "
                                f"got {base_type!r}")
    check_compute_type(compute_type, "llm load")
    t0 = time.perf_counter()
    spath = text_path(path, "llm load")
    where = f"llm load {spath!r}"
    reader = open_reader(spath, where)
    cfg, table = read_config(reader, where)
    is_bytes = _is_bytes(reader, where)
    tokenizer = tokenizer_of(spath, reader)
    shapes = param_shapes(cfg)
    if progress is None:
        progress = os.path.getsize(spath) > PROGRESS_BYTES
    bar = ProgressBar(len(shapes), stream) if progress else None
    sched = sched or Scheduler([cpu_init()])
    if base_type == "keep" or compute_type == "bf16":
        if base_type == "keep" and getattr(reader, "byte_order", "I") != "I":
            raise DTypeError(f"{where}: the file's byte order is not this machine's; its blocks "
                             f"cannot be mapped as they are (load it with base_type='f32')")
        net = map_model(cfg, sched, table, where, bar, keep=base_type == "keep",
                        compute_type=compute_type)
    else:
        net = build_model(cfg, sched)
        for name, arr in iter_f32(table, shapes, where, bar):
            tensor_set(net.params[name], np.ascontiguousarray(arr))
    types: dict[str, int] = {}
    for t in table.values():
        key = t.tensor_type.name
        types[key] = types.get(key, 0) + 1
    if ggml_order is None:  # llama.cpp's bits: every matrix of a type ordered here
        ggml_order = base_type == "keep" and all(
            int(t.type) in GGML_ORDER_TYPES for t in net.params.values() if t.ne[1] > 1)
    net.ggml_order = bool(ggml_order)
    return Model(spath, cfg, net, tokenizer, time.perf_counter() - t0, types, is_bytes,
                 base_type, compute_type)
