"""The reference for nodes with a quantized source: dequantize with ``gguf.quants`` (NumPy;
the package's checked port of ggml's C), then run the F32 array code. Quantizing (cpy from
F32 to a quantized type) uses ``gguf.quants.quantize`` likewise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....tensor import Tensor

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def dequantized(be: ArrayBackend, t: Tensor, raw: Any) -> Any:
    """The float32 ``xp`` array of the quantized tensor ``t`` whose raw blocks are ``raw``
    (4-D, ``(ne3, ne2, ne1, row bytes)``)."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    host = np.ascontiguousarray(be.to_host(raw))
    values = quants.dequantize(host, GGMLQuantizationType(int(t.type)))
    return be.xp.asarray(values.astype(np.float32, copy=False))


def quantized(be: ArrayBackend, t: Tensor, values: Any) -> Any:
    """The raw blocks (``xp`` uint8) of float32 ``values`` as ``t``'s quantized type."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    host = np.ascontiguousarray(be.to_host(values), dtype=np.float32)
    return be.xp.asarray(quants.quantize(host, GGMLQuantizationType(int(t.type))))
