"""A model's weights as host float32 arrays, made one at a time when looked up (the GGUF
export, LoRA merges and checkpoints read them so)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from ...backend import tensor_get
from ...lowp import widen
from ...quants import dequantize
from .graph import LlamaModel, param_shapes

__all__ = ["WeightMap", "weight_map", "get_weights"]


class WeightMap(Mapping[str, np.ndarray]):
    """A model's weights as host float32 arrays (quantized, F16 and BF16 ones widened), NumPy order,
    llama.cpp's names, each made when it is looked up and not kept: a reader (the GGUF export)
    that takes one at a time holds one tensor's float32 copy, not the model's."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.shapes = param_shapes(model.cfg)

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.model.params[name]
        raw = tensor_get(t)
        if t.type.is_lowp:
            raw = widen(t.type, raw)
        return (dequantize(raw, t.type) if t.type.is_quantized else raw).reshape(
            self.shapes[name])

    def __contains__(self, name: object) -> bool:  # without computing the weight
        return name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def weight_map(model: LlamaModel) -> WeightMap:
    """:class:`WeightMap` of ``model``: its weights computed on access."""
    return WeightMap(model)


def get_weights(model: LlamaModel) -> dict[str, np.ndarray]:
    """Host float32 copies of the weights (quantized ones dequantized), NumPy order,
    llama.cpp's names."""
    return dict(WeightMap(model))
