"""ggml's float order for a graph's forward ops: :func:`set_ggml_order` makes an op round as
ggml's CPU backend does in llama.cpp's x86-64 AVX2+FMA build, so that a model gives llama.cpp's
bits (docs/ggml-order.md). The CPU backend computes a flagged op with the kernels of
:mod:`ggopt._kernels._ggml_order`; other backends compute it as usual.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._kernels._ggml_order import QUANT_TYPES
from ..errors import InvalidValueError
from ..tensor import Op, Tensor
from ..types import F32
from .norm import NormParams
from .pointwise import GluParams
from .rope import RopeParams
from .softmax import SoftMaxParams

__all__ = ["MulMatParams", "has_ggml_order", "set_ggml_order"]


@dataclass(frozen=True, slots=True)
class MulMatParams:
    """``Op.MUL_MAT`` set to ggml's float order (a plain product has no parameters);
    ``kv_padded``: its reduction as if padded with zeros to a multiple of 8."""

    ggml_order: bool
    kv_padded: bool = False


def _why_not(t: Tensor) -> str | None:
    """Why ``t``'s op has no ggml order here, or None when it has one."""
    p = t.op_params
    if t.op is Op.RMS_NORM:
        return None
    if t.op is Op.ROPE:
        return None if isinstance(p, RopeParams) and p.ext_factor == 0 else \
            "a YaRN rope (ext_factor != 0)"
    if t.op is Op.SOFT_MAX:
        return None if isinstance(p, SoftMaxParams) and p.max_bias == 0 else \
            "a softmax with ALiBi (max_bias > 0)"
    if t.op is Op.GLU:
        return None if len(t.src) == 2 else "a one-source swiglu (use swiglu_split)"
    if t.op is Op.MUL_MAT:
        a, b = t.src[0], t.src[1]
        if a is None or b is None:
            return "a product without both sources"
        if a.type is F32 or int(a.type) in QUANT_TYPES:
            return None
        return (f"a product of a {a.type.name} weight (F32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and "
                "Q2_K ... Q6_K have one)")
    return f"op {t.op.name}"


def has_ggml_order(t: Tensor) -> bool:
    """Whether :func:`set_ggml_order` accepts ``t``."""
    return _why_not(t) is None


def set_ggml_order(t: Tensor, *, kv_padded: bool = False) -> Tensor:
    """Compute ``t`` in ggml's float order (llama.cpp's x86-64 AVX2+FMA build): an RMS_NORM,
    a forward ROPE without YaRN, a SOFT_MAX without ALiBi, a ``swiglu_split`` or a MUL_MAT of
    an F32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or Q2_K ... Q6_K ``a``. Returns ``t``;
    InvalidValueError for any other op. Only the rounding changes (the same values to float
    rounding); set it before the graph is allocated.

    ``kv_padded`` (a SOFT_MAX, or a MUL_MAT of an F32 ``a``: attention's scores and their
    product with the values): round as llama.cpp does over its KV cache, whose width is padded
    with masked slots to a multiple of 8: the softmax's last partial 8 through ggml's vector
    ``expf`` and the product in tinyBLAS's order over the reduction padded with zeros."""
    why = _why_not(t)
    if why is not None:
        raise InvalidValueError(f"set_ggml_order: {why} has no ggml order here "
                                "(docs/ggml-order.md)")
    if kv_padded and not (t.op is Op.SOFT_MAX or (t.op is Op.MUL_MAT and t.src[0] is not None
                                                  and t.src[0].type is F32)):
        raise InvalidValueError("set_ggml_order: kv_padded applies to a SOFT_MAX or an F32 "
                                f"MUL_MAT, not {t.op.name}")
    if t.op is Op.MUL_MAT:
        t.op_params = MulMatParams(True, bool(kv_padded))
    elif t.op is Op.SOFT_MAX:
        assert isinstance(t.op_params, SoftMaxParams)
        t.op_params = dataclasses.replace(t.op_params, ggml_order=True, kv_padded=bool(kv_padded))
    else:
        p = t.op_params
        assert isinstance(p, (NormParams, RopeParams, GluParams))
        t.op_params = dataclasses.replace(p, ggml_order=True)
    return t


def in_ggml_order(t: Tensor) -> bool:
    """Whether ``t`` was set to ggml's float order."""
    return bool(getattr(t.op_params, "ggml_order", False))
