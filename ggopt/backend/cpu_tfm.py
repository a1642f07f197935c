"""CPU compilers of the transformer ops (:mod:`ggopt._newops`): norms, rope, attention,
pointwise ops and concat, each binding its arrays once and running one kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._kernels import _attn, _copy, _norm, _pointwise, _rope, _softmax
from .._kernels import _elementwise as ew
from .._newops._base import params_of
from .._newops.attention import DiagMaskParams, SoftMaxParams
from .._newops.concat import ConcatParams
from .._newops.norm import NormParams
from .._newops.pointwise import GluParams
from .._newops.rope import RopeParams
from ..tensor import Op, Tensor
from .base import Step
from .cpu_ops import COMPILERS

if TYPE_CHECKING:
    from .cpu import CPUBackend

Mem = Callable[[Tensor], object]
TfmCompiler = Callable[["CPUBackend", Tensor, tuple, Mem], Step]


def _array4d(t: Tensor):
    return t.array4d()


def register(*ops: Op) -> Callable[[TfmCompiler], TfmCompiler]:
    def enter(fn: TfmCompiler) -> TfmCompiler:
        for op in ops:
            COMPILERS[op] = lambda be, node, srcs, fn=fn: fn(be, node, srcs, _array4d)
        return fn

    return enter


# --- norm -----------------------------------------------------------------------------------

_NORM = {Op.RMS_NORM: _norm.rms_norm, Op.NORM: _norm.norm}
_NORM_BACK = {Op.RMS_NORM_BACK: _norm.rms_norm_back, Op.NORM_BACK: _norm.norm_back}


@register(Op.RMS_NORM, Op.NORM)
def _norm_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    kernel, eps = _NORM[node.op], params_of(node, NormParams).eps
    a, d = mem(srcs[0]), mem(node)
    return lambda: kernel(a, d, eps, be.n_threads)


@register(Op.RMS_NORM_BACK, Op.NORM_BACK)
def _norm_back_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    kernel, eps = _NORM_BACK[node.op], params_of(node, NormParams).eps
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: kernel(g, x, d, eps, be.n_threads)


# --- rope -----------------------------------------------------------------------------------


@register(Op.ROPE, Op.ROPE_BACK)
def _rope_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    p = params_of(node, RopeParams)
    x, pos, d = mem(srcs[0]), mem(srcs[1])[0, 0, 0], mem(node)
    ff = mem(srcs[2])[0, 0, 0] if len(srcs) > 2 else None
    sign = 1.0 if node.op is Op.ROPE else -1.0
    return lambda: _rope.rope(x, pos, ff, d, p.n_dims, p.neox, p.n_ctx_orig, p.freq_base,
                              p.freq_scale, p.ext_factor, p.attn_factor, p.beta_fast,
                              p.beta_slow, sign, be.n_threads)


# --- attention ------------------------------------------------------------------------------


@register(Op.SOFT_MAX)
def _soft_max_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    p = params_of(node, SoftMaxParams)
    a, d = mem(srcs[0]), mem(node)
    if len(srcs) == 1:
        return lambda: _softmax.soft_max(a, d, p.scale, be.n_threads)
    m = mem(srcs[1])
    return lambda: _attn.soft_max_ext(a, m, d, p.scale, p.max_bias, be.n_threads)


@register(Op.SOFT_MAX_BACK)
def _soft_max_back_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    s = params_of(node, SoftMaxParams).scale
    g, y, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: _softmax.soft_max_back(g, y, d, s, be.n_threads)


@register(Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO)
def _diag_mask_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    n_past = params_of(node, DiagMaskParams).n_past
    value = float("-inf") if node.op is Op.DIAG_MASK_INF else 0.0
    a, d = mem(srcs[0]), mem(node)
    return lambda: _attn.diag_mask(a, d, n_past, value, be.n_threads)


# --- pointwise ------------------------------------------------------------------------------


@register(Op.GLU)
def _glu_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    d = mem(node)
    if len(srcs) == 2:
        x, u = mem(srcs[0]), mem(srcs[1])
    else:
        a, n = mem(srcs[0]), node.ne[0]
        x, u = a[..., :n], a[..., n:]
        if params_of(node, GluParams).swapped:
            x, u = u, x
    return lambda: _pointwise.swiglu(x, u, d, be.n_threads)


@register(Op.SIN, Op.COS)
def _trig_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    kernel = _pointwise.sin if node.op is Op.SIN else _pointwise.cos
    a, d = mem(srcs[0]), mem(node)
    return lambda: kernel(a, d, be.n_threads)


@register(Op.ADD1)
def _add1_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: ew.binary(ew.BIN_ADD, a, b, d, be.n_threads)


# --- concat ---------------------------------------------------------------------------------


@register(Op.CONCAT)
def _concat_c(be: CPUBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    axis = 3 - params_of(node, ConcatParams).dim
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    na = a.shape[axis]
    da = d[(slice(None),) * axis + (slice(0, na),)]
    db = d[(slice(None),) * axis + (slice(na, None),)]

    def step() -> None:
        _copy.copy(a, da, be.n_threads)
        _copy.copy(b, db, be.n_threads)

    return step
