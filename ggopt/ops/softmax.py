"""Softmax (with scale, mask and ALiBi: ggml_soft_max_ext) and cross-entropy loss, forward and
backward; the cross-entropy on class ids (ggopt's own op).

Kernels: :mod:`ggopt._kernels._softmax` (no mask), :mod:`ggopt._kernels._attention` (a mask),
:mod:`ggopt._kernels._ce_ids` (class ids); compilers: ``backend/*_ops/softmax.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import Context
from ..errors import InvalidValueError, ShapeError
from ..tensor import Op, Tensor
from ..types import F32, I32
from ._base import (
    GradSink,
    as_int,
    as_scalar,
    backward,
    check_ctx,
    check_f32,
    check_tensor,
    check_type,
    ignore_sources,
    ne_str,
    params_of,
)

__all__ = ["SoftMaxParams", "CrossEntropyIdsParams", "soft_max", "soft_max_ext",
           "soft_max_ext_back", "cross_entropy_loss", "cross_entropy_loss_back",
           "cross_entropy_loss_ids", "cross_entropy_loss_ids_back"]


@dataclass(frozen=True, slots=True)
class SoftMaxParams:
    """``Op.SOFT_MAX`` / ``Op.SOFT_MAX_BACK``: softmax of ``scale*a + slope*mask`` along ``ne0``,
    ``slope`` ALiBi's per-head slope when ``max_bias > 0``, else 1."""

    scale: float
    max_bias: float
    #: a SOFT_MAX in ggml's float order (:func:`ggopt.set_ggml_order`), its rows as if padded
    #: with masked slots to a multiple of 8 (``kv_padded``)
    ggml_order: bool = False
    kv_padded: bool = False


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Softmax along ``ne0`` (ggml_soft_max)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0)


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                 max_bias: float) -> Tensor:
    """``softmax(scale*a + slope*mask)`` along ``ne0`` (ggml_soft_max_ext).

    ``mask`` (optional, F32) is ``[ne0, >= ne1, m2, m3]`` with ``m2``, ``m3`` dividing ``a``'s
    ``ne2``, ``ne3``: row ``i1`` of matrix ``(i2, i3)`` adds mask row ``i1`` of mask matrix
    ``(i2 % m2, i3 % m3)``, e.g. one causal ``[n_kv, n_tokens]`` mask for every head. With
    ``max_bias > 0`` head ``i2`` (of ``ne2``) scales the mask by its ALiBi slope. PyTorch:
    ``softmax(scale * a + mask, dim=-1)``. The mask gets no gradient.
    """
    fn = "soft_max_ext"
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    scale = as_scalar(fn, "scale", scale)
    max_bias = as_scalar(fn, "max_bias", max_bias)
    if mask is None:
        if max_bias > 0:
            raise ShapeError("ggml_soft_max_ext: ALiBi (max_bias > 0) needs a mask")
        return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a,), SoftMaxParams(scale, max_bias))
    check_tensor(fn, "mask", mask)
    check_type(fn, "mask", mask, F32)
    m = mask.ne
    if m[0] != a.ne[0] or m[1] < a.ne[1] or 0 in m or a.ne[2] % m[2] or a.ne[3] % m[3]:
        raise ShapeError(f"ggml_soft_max_ext: the mask {ne_str(mask)} does not broadcast over "
                         f"a {ne_str(a)}: it needs ne0 == {a.ne[0]}, ne1 >= {a.ne[1]}, and "
                         "ne2, ne3 dividing a's")
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX, (a, mask), SoftMaxParams(scale, max_bias))


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float,
                      max_bias: float) -> Tensor:
    """The gradient of :func:`soft_max_ext` w.r.t. its input, given the output gradient ``a``
    and the softmax output ``b``: ``scale * b * (a - sum(a*b))`` per row
    (ggml_soft_max_ext_back). ``max_bias`` only scales the mask, so it does not enter."""
    fn = "soft_max_ext_back"
    check_ctx(fn, ctx)
    check_f32(fn, a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_{fn}: the gradient a {ne_str(a)} and the softmax output b "
                         f"{ne_str(b)} must have one shape")
    prm = SoftMaxParams(as_scalar(fn, "scale", scale), as_scalar(fn, "max_bias", max_bias))
    return ctx.new_op(F32, a.ne, Op.SOFT_MAX_BACK, (a, b), prm)


@backward(Op.SOFT_MAX)
def _soft_max_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if len(node.src) > 1 and sink.needs(1):
        raise ShapeError("ggml_soft_max_ext: the mask gets no gradient; it must not depend on a "
                         "parameter")
    if sink.needs(0):
        prm = params_of(node, SoftMaxParams)
        sink.add(0, soft_max_ext_back(ctx, g, node, prm.scale, prm.max_bias))


def cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Mean over rows of ``-sum(b * log_softmax(a))``: a scalar (ggml_cross_entropy_loss).

    ``a`` holds logits and ``b`` target probabilities, both ``[nclasses, nrows, ...]``.
    """
    check_ctx("cross_entropy_loss", ctx)
    check_f32("cross_entropy_loss", a=a, b=b)
    if a.ne != b.ne:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {ne_str(a)} and labels "
                         f"{ne_str(b)} must have the same shape")
    if a.nelements() == 0:
        raise ShapeError(f"ggml_cross_entropy_loss: logits {ne_str(a)} need at least one class "
                         "and one row (the loss is a mean over rows)")
    return ctx.new_op(F32, (1, 1, 1, 1), Op.CROSS_ENTROPY_LOSS, (a, b))


def cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Gradient of :func:`cross_entropy_loss` w.r.t. the logits ``b`` given the scalar
    output gradient ``a`` and labels ``c`` (ggml_cross_entropy_loss_back)."""
    check_ctx("cross_entropy_loss_back", ctx)
    check_f32("cross_entropy_loss_back", a=a, b=b, c=c)
    if not a.is_scalar():
        raise ShapeError(f"ggml_cross_entropy_loss_back: the gradient must be a scalar, got "
                         f"{ne_str(a)}")
    if b.ne != c.ne:
        raise ShapeError(f"ggml_cross_entropy_loss_back: logits {ne_str(b)} and labels "
                         f"{ne_str(c)} must have the same shape")
    return ctx.new_op(F32, b.ne, Op.CROSS_ENTROPY_LOSS_BACK, (a, b, c))


@backward(Op.CROSS_ENTROPY_LOSS)
def _ce_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    a, b = node.src
    if sink.needs(1):
        raise ShapeError("ggml_cross_entropy_loss: gradients w.r.t. the labels are not supported; "
                         "the labels must not depend on a parameter")
    if sink.needs(0):
        sink.add(0, cross_entropy_loss_back(ctx, g, a, b))


@dataclass(frozen=True, slots=True)
class CrossEntropyIdsParams:
    """``Op.CROSS_ENTROPY_LOSS_IDS(_BACK)``: rows labelled ``ignore_id`` take no part."""

    ignore_id: int


def _check_ids(fn: str, a: Tensor, ids: Tensor, ignore_id: object) -> CrossEntropyIdsParams:
    check_tensor(fn, "ids", ids)
    check_type(fn, "ids", ids, I32)
    want = (*a.ne[1:], 1)
    if ids.ne != want:
        raise ShapeError(f"{fn}: logits {ne_str(a)} need one class id per row, ids of ne "
                         f"{list(want)}; got {ne_str(ids)}")
    if a.nelements() == 0:
        raise ShapeError(f"{fn}: logits {ne_str(a)} need at least one class and one row (the "
                         "loss is a mean over rows)")
    v = as_int(fn, "ignore_id", ignore_id)
    if not -2**31 <= v < 2**31:
        raise InvalidValueError(f"{fn}: ignore_id must be an int32, got {v}")
    return CrossEntropyIdsParams(v)


def cross_entropy_loss_ids(ctx: Context, a: Tensor, ids: Tensor,
                           ignore_id: int = -100) -> Tensor:
    """:func:`cross_entropy_loss` of the logits ``a`` against one-hot rows of the class
    ``ids``, without the one-hot tensor (ggopt's own op, not in ggml): a scalar,
    ``-(1/nrows) * sum_r log_softmax(a)[r, ids[r]]`` over every row that is not labelled
    ``ignore_id``, still divided by all ``nrows`` rows. Such a row adds 0 and gets a zero
    gradient (PyTorch's ``ignore_index``, up to the mean's divisor). ``a``: F32 ``[nclasses,
    n1, n2, n3]``; ``ids``: I32 ``[n1, n2, n3]``, each in ``[0, nclasses)`` or ``ignore_id``
    (InvalidValueError when the graph runs, before the op writes anything). The loss and
    the gradient equal the one-hot op's bit for bit."""
    fn = "cross_entropy_loss_ids"
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    prm = _check_ids(fn, a, ids, ignore_id)
    return ctx.new_op(F32, (1, 1, 1, 1), Op.CROSS_ENTROPY_LOSS_IDS, (a, ids), prm)


def cross_entropy_loss_ids_back(ctx: Context, g: Tensor, a: Tensor, ids: Tensor,
                                ignore_id: int = -100) -> Tensor:
    """The gradient of :func:`cross_entropy_loss_ids` w.r.t. the logits ``a`` given the scalar
    output gradient ``g``: ``(softmax(a) - one_hot(ids)) * g / nrows``, rows labelled
    ``ignore_id`` zero."""
    fn = "cross_entropy_loss_ids_back"
    check_ctx(fn, ctx)
    check_f32(fn, g=g, a=a)
    if not g.is_scalar():
        raise ShapeError(f"{fn}: the gradient must be a scalar, got {ne_str(g)}")
    prm = _check_ids(fn, a, ids, ignore_id)
    return ctx.new_op(F32, a.ne, Op.CROSS_ENTROPY_LOSS_IDS_BACK, (g, a, ids), prm)


@backward(Op.CROSS_ENTROPY_LOSS_IDS)
def _ce_ids_back(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    if sink.needs(0):
        a, ids = node.src
        prm = params_of(node, CrossEntropyIdsParams)
        sink.add(0, cross_entropy_loss_ids_back(ctx, g, a, ids, prm.ignore_id))


ignore_sources(Op.CROSS_ENTROPY_LOSS_IDS, 1)
