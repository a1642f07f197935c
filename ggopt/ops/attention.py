"""The causal masks of attention scores: diag_mask_inf and diag_mask_zero.

Kernel: :mod:`ggopt._kernels._attention` (beside the masked softmax); compilers:
``backend/*_ops/attention.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import ShapeError
from ..tensor import Op, Tensor
from ..types import F32
from ._base import GradSink, as_int, backward, check_ctx, check_f32, params_of

__all__ = ["DiagMaskParams", "diag_mask_inf", "diag_mask_zero"]


@dataclass(frozen=True, slots=True)
class DiagMaskParams:
    """``Op.DIAG_MASK_INF`` / ``Op.DIAG_MASK_ZERO``: columns ``i0 > n_past + i1`` are masked."""

    n_past: int


def _diag_mask(fn: str, op: Op, ctx: Context, a: Tensor, n_past: int) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    n_past = as_int(fn, "n_past", n_past)
    if n_past < 0:
        raise ShapeError(f"ggml_{fn}: n_past must be >= 0, got {n_past}")
    return ctx.new_op(F32, a.ne, op, (a,), DiagMaskParams(n_past))


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """``a`` with ``-inf`` in every column ``i0 > n_past + i1`` of row ``i1`` (ggml_diag_mask_inf):
    the causal mask of ``[n_kv, n_tokens, ...]`` attention scores."""
    return _diag_mask("diag_mask_inf", Op.DIAG_MASK_INF, ctx, a, n_past)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """``a`` with 0 in every column ``i0 > n_past + i1`` of row ``i1`` (ggml_diag_mask_zero)."""
    return _diag_mask("diag_mask_zero", Op.DIAG_MASK_ZERO, ctx, a, n_past)


@backward(Op.DIAG_MASK_INF)
@backward(Op.DIAG_MASK_ZERO)
def _diag_mask_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        sink.add(0, diag_mask_zero(ctx, g, params_of(node, DiagMaskParams).n_past))
