"""The llama example's model: :mod:`ggopt.models.llama` (config, weights, the graph builder),
re-exported under the example's names; ``N_VOCAB`` is the byte vocabulary's size."""

from __future__ import annotations

from ..models.llama import (
    Config,
    Inputs,
    LlamaModel,
    build_logits,
    build_model,
    get_weights,
    init_weights,
    make_inputs,
    param_shapes,
    set_weights,
)
from ..models.llama.config import N_VOCAB_BYTES as N_VOCAB

__all__ = ["N_VOCAB", "Config", "LlamaModel", "Inputs", "param_shapes", "init_weights",
           "build_model", "make_inputs", "build_logits", "set_weights", "get_weights"]
