"""The transformer ops (llama's training graph): norms, rope, attention masks and softmax,
SwiGLU, trig, add1 and concat; constructors with ggml's names, each with its backward rule."""

from __future__ import annotations

from .attention import (
    DiagMaskParams,
    SoftMaxParams,
    diag_mask_inf,
    diag_mask_zero,
    soft_max,
    soft_max_ext,
    soft_max_ext_back,
)
from .concat import ConcatParams, concat
from .norm import NormParams, norm, norm_back, rms_norm, rms_norm_back
from .pointwise import (
    GluParams,
    add1,
    cos,
    silu_back,
    sin,
    swiglu,
    swiglu_split,
    swiglu_swapped,
)
from .rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL, RopeParams, rope, rope_ext, rope_ext_back

__all__ = [
    "ConcatParams", "DiagMaskParams", "GluParams", "NormParams", "ROPE_TYPE_NEOX",
    "ROPE_TYPE_NORMAL", "RopeParams", "SoftMaxParams", "add1", "concat", "cos", "diag_mask_inf",
    "diag_mask_zero", "norm", "norm_back", "rms_norm", "rms_norm_back", "rope", "rope_ext",
    "rope_ext_back", "silu_back", "sin", "soft_max", "soft_max_ext", "soft_max_ext_back",
    "swiglu", "swiglu_split", "swiglu_swapped",
]
