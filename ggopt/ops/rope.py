"""Rotary position embedding: rope, rope_ext and the gradient op rope_ext_back.

Kernel: :mod:`ggopt._kernels._rope` (its docstring has the formula); compilers:
``backend/*_ops/rope.py``.
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
    check_choice,
    check_ctx,
    check_f32,
    check_tensor,
    check_type,
    ne_str,
    params_of,
)

__all__ = ["ROPE_TYPE_NEOX", "ROPE_TYPE_NORMAL", "RopeParams", "rope", "rope_ext",
           "rope_ext_back"]

#: Rotate adjacent pairs ``(2i, 2i+1)`` (llama).
ROPE_TYPE_NORMAL = 0
#: Rotate the halves ``(i, i + n_dims/2)`` (GPT-NeoX, HF's ``rotate_half``).
ROPE_TYPE_NEOX = 2


_MODES = {ROPE_TYPE_NORMAL: "ROPE_TYPE_NORMAL", ROPE_TYPE_NEOX: "ROPE_TYPE_NEOX"}


@dataclass(frozen=True, slots=True)
class RopeParams:
    """``Op.ROPE`` / ``Op.ROPE_BACK``: ggml_rope_ext's parameters, in its order."""

    n_dims: int
    mode: int
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    #: a forward ROPE in ggml's float order (:func:`ggopt.set_ggml_order`)
    ggml_order: bool = False

    @property
    def neox(self) -> bool:
        return self.mode == ROPE_TYPE_NEOX


def _rope(fn: str, op: Op, ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
          mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
          attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    check_ctx(fn, ctx)
    check_f32(fn, a=a)
    check_tensor(fn, "b", b)
    check_type(fn, "b (the positions)", b, I32)
    n_dims = as_int(fn, "n_dims", n_dims)
    mode = check_choice(fn, "mode", mode, _MODES)
    if n_dims < 2 or n_dims % 2 or n_dims > a.ne[0]:
        raise ShapeError(f"ggml_{fn}: n_dims must be even and between 2 and a.ne[0]={a.ne[0]}, "
                         f"got {n_dims}")
    if not b.is_vector() or b.ne[0] != a.ne[2]:
        raise ShapeError(f"ggml_{fn}: the positions b {ne_str(b)} must be a vector of "
                         f"a.ne[2]={a.ne[2]} (one per token) for a {ne_str(a)}")
    srcs: tuple[Tensor, ...] = (a, b)
    if c is not None:
        check_tensor(fn, "c", c)
        check_type(fn, "c (the frequency factors)", c, F32)
        if not c.is_vector() or c.ne[0] < n_dims // 2:
            raise ShapeError(f"ggml_{fn}: the frequency factors c {ne_str(c)} must be a vector "
                             f"of at least n_dims/2={n_dims // 2}")
        srcs = (a, b, c)
    prm = RopeParams(
        n_dims, mode, as_int(fn, "n_ctx_orig", n_ctx_orig), as_scalar(fn, "freq_base", freq_base),
        as_scalar(fn, "freq_scale", freq_scale), as_scalar(fn, "ext_factor", ext_factor),
        as_scalar(fn, "attn_factor", attn_factor), as_scalar(fn, "beta_fast", beta_fast),
        as_scalar(fn, "beta_slow", beta_slow))
    if not prm.freq_base > 0 or not prm.freq_scale > 0:
        raise InvalidValueError(f"ggml_{fn}: freq_base and freq_scale must be > 0, got "
                         f"{prm.freq_base} and {prm.freq_scale}")
    return ctx.new_op(F32, a.ne, op, srcs, prm)


def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    """:func:`rope_ext` with ggml_rope's defaults: no frequency factors, base 10000, no YaRN."""
    return rope_ext(ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


def rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
             n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
             attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """Rotate the first ``n_dims`` of every row of ``a=[head_dim, n_head, n_tokens, ...]`` by
    its token's position (ggml_rope_ext).

    ``b``: I32 positions ``[n_tokens]``; ``c``: optional F32 frequency factors (``>=
    n_dims/2``, dividing the angles; no gradient). Pair ``i`` of token ``t`` turns by
    ``b[t] * freq_base**(-2i/n_dims) / c[i]``, with YaRN's interpolation (``freq_scale``,
    ``ext_factor``, ``beta_fast``, ``beta_slow``, ``n_ctx_orig``) and magnitude
    ``attn_factor``. ``mode``: :data:`ROPE_TYPE_NORMAL` (adjacent pairs, llama) or
    :data:`ROPE_TYPE_NEOX` (halves).
    """
    return _rope("rope_ext", Op.ROPE, ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base,
                 freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)


def rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                  n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                  attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """The gradient of :func:`rope_ext` given the output gradient ``a``: the same rotation by
    the negative angle (ggml_rope_ext_back)."""
    return _rope("rope_ext_back", Op.ROPE_BACK, ctx, a, b, c, n_dims, mode, n_ctx_orig,
                 freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)


def _rope_grad(ctx: Context, node: Tensor, g: Tensor, sink: GradSink, inverse: bool) -> None:
    if len(node.src) > 2 and sink.needs(2):
        raise ShapeError("ggml_rope_ext: the frequency factors get no gradient; they must not "
                         "depend on a parameter")
    if sink.needs(0):
        p = params_of(node, RopeParams)
        c = node.src[2] if len(node.src) > 2 else None
        make = rope_ext_back if inverse else rope_ext
        sink.add(0, make(ctx, g, node.src[1], c, p.n_dims, p.mode, p.n_ctx_orig, p.freq_base,
                         p.freq_scale, p.ext_factor, p.attn_factor, p.beta_fast, p.beta_slow))


@backward(Op.ROPE)
def _rope_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    _rope_grad(ctx, node, g, sink, inverse=True)


@backward(Op.ROPE_BACK)
def _rope_back_rule(ctx: Context, node: Tensor, g: Tensor, sink: GradSink) -> None:
    _rope_grad(ctx, node, g, sink, inverse=False)
