"""llama-architecture models as llama.cpp runs them: hyper-parameters from GGUF keys, weights
of any tensor type the ``gguf`` package dequantizes, and the one graph builder used by
training, evaluation and generation.

``load(path)`` returns a :class:`Model`; ``logits(model, ids)`` the logits of a token sequence.
"""

from .byte_gguf import byte_tokens
from .config import ARCH, N_VOCAB_BYTES, Config, config_from_fields
from .convert import write_f32
from .graph import (
    Graph,
    Inputs,
    KVCache,
    LlamaModel,
    build_graph,
    build_logits,
    build_model,
    init_weights,
    make_cache,
    make_inputs,
    param_shapes,
    set_segments,
    set_weights,
)
from .loader import Model, load, read_config, read_weights
from .run import logits
from .vocab import Tokenizer
from .weight_map import get_weights, weight_map

__all__ = ["ARCH", "N_VOCAB_BYTES", "Config", "config_from_fields", "byte_tokens", "write_f32",
           "Graph", "Inputs", "KVCache", "LlamaModel", "build_graph", "build_logits",
           "build_model", "get_weights", "init_weights", "make_cache", "make_inputs",
           "param_shapes", "set_segments", "set_weights", "weight_map", "Model", "load",
           "read_config", "read_weights", "logits", "Tokenizer"]
