"""Array-module compilers (NumPy or CuPy) of the transformer ops (:mod:`ggopt._newops`), with
the CPU kernels' semantics: row sums in float64, ggml's rope angles, mask broadcast by modulo."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .._newops._base import params_of
from .._newops.attention import DiagMaskParams, SoftMaxParams
from .._newops.concat import ConcatParams
from .._newops.norm import NormParams
from .._newops.pointwise import GluParams
from .._newops.rope import RopeParams
from ..tensor import Op, Tensor
from .base import Step
from .xp_ops import COMPILERS, split_axes, tile_split

if TYPE_CHECKING:
    from .xp import ArrayBackend

F32 = np.float32
Mem = Callable[[Tensor], object]
XpCompiler = Callable[["ArrayBackend", Tensor, tuple, Mem], Step]


def _array4d(t: Tensor):
    return t.array4d()


def register(*ops: Op) -> Callable[[XpCompiler], XpCompiler]:
    def enter(fn: XpCompiler) -> XpCompiler:
        for op in ops:
            COMPILERS[op] = lambda be, node, srcs, fn=fn: fn(be, node, srcs, _array4d)
        return fn

    return enter


def _row_sum(xp, x):
    """Row sums (last axis) in float64, keepdims."""
    return xp.sum(x, axis=3, keepdims=True, dtype=xp.float64)


# --- norm -----------------------------------------------------------------------------------


def _rms_norm(xp, x, eps):
    mean = (_row_sum(xp, x * x) / x.shape[3]).astype(xp.float32)
    return x * (F32(1) / xp.sqrt(mean + F32(eps)))


def _norm(xp, x, eps):
    n = x.shape[3]
    c = x - (_row_sum(xp, x) / n).astype(xp.float32)
    var = (_row_sum(xp, c * c) / n).astype(xp.float32)
    return c * (F32(1) / xp.sqrt(var + F32(eps)))


def _rms_norm_back(xp, g, x, eps):
    n = x.shape[3]
    sxx, sxg = _row_sum(xp, x * x), _row_sum(xp, x * g)
    r = (F32(1) / xp.sqrt((sxx / n).astype(xp.float32) + F32(eps)))
    c = (-sxg / (sxx + eps * n)).astype(xp.float32)
    return (g + c * x) * r


def _norm_back(xp, g, x, eps):
    n = x.shape[3]
    c = x - (_row_sum(xp, x) / n).astype(xp.float32)
    var = (_row_sum(xp, c * c) / n).astype(xp.float32)
    r = 1.0 / xp.sqrt((var + F32(eps)).astype(xp.float64))
    mg = _row_sum(xp, g) / n
    mcg = _row_sum(xp, c * g) / n
    return (r.astype(xp.float32) * g + (-mcg * r**3).astype(xp.float32) * c
            + (-r * mg).astype(xp.float32))


_NORM = {Op.RMS_NORM: _rms_norm, Op.NORM: _norm}
_NORM_BACK = {Op.RMS_NORM_BACK: _rms_norm_back, Op.NORM_BACK: _norm_back}


@register(Op.RMS_NORM, Op.NORM)
def _norm_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, fn, eps = be.xp, _NORM[node.op], params_of(node, NormParams).eps
    a, d = mem(srcs[0]), mem(node)

    def step() -> None:
        d[...] = fn(xp, a, eps)

    return step


@register(Op.RMS_NORM_BACK, Op.NORM_BACK)
def _norm_back_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, fn, eps = be.xp, _NORM_BACK[node.op], params_of(node, NormParams).eps
    g, x, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        d[...] = fn(xp, g, x, eps)

    return step


# --- rope -----------------------------------------------------------------------------------


def _corr_dims(p: RopeParams) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32 (log of 0 or of a negative gives -inf/NaN as in C)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        def dim(n_rot: float) -> np.float32:
            ratio = F32(p.n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi))
            return F32(p.n_dims) * np.log(ratio) / (F32(2) * np.log(F32(p.freq_base)))

        start = np.floor(dim(p.beta_fast))
        end = np.ceil(dim(p.beta_slow))
    return float(max(F32(0), start)), float(min(F32(p.n_dims - 1), end))


def _rope_table(xp, p: RopeParams, pos, ff, sign: float):
    """(cos, sin) of shape (n_tokens, 1, n_dims/2): the angles as ggml computes them, in float32
    (the power of the base by repeated multiplication, as ggml's rope cache)."""
    theta_scale = np.power(F32(p.freq_base), F32(-2.0) / F32(p.n_dims), dtype=F32)
    theta = pos.astype(xp.float32)
    low, high = _corr_dims(p)
    cols_c, cols_s = [], []
    mscale = F32(p.attn_factor)
    if p.ext_factor != 0:
        mscale = F32(mscale * (F32(1) + F32(0.1) * np.log(F32(1) / F32(p.freq_scale))))
    for i in range(p.n_dims // 2):
        extrap = theta if ff is None else theta / ff[i]
        interp = F32(p.freq_scale) * extrap
        th = interp
        if p.ext_factor != 0:
            y = (F32(i) - F32(low)) / F32(max(0.001, high - low))
            mix = F32((1 - min(1.0, max(0.0, float(y)))) * p.ext_factor)
            th = interp * (F32(1) - mix) + extrap * mix
        cols_c.append(xp.cos(th) * mscale)
        cols_s.append(xp.sin(th) * mscale * F32(sign))
        theta = theta * theta_scale
    return xp.stack(cols_c, axis=-1)[:, None, :], xp.stack(cols_s, axis=-1)[:, None, :]


@register(Op.ROPE, Op.ROPE_BACK)
def _rope_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, p = be.xp, params_of(node, RopeParams)
    x, pos, d = mem(srcs[0]), mem(srcs[1])[0, 0, 0], mem(node)
    ff = mem(srcs[2])[0, 0, 0] if len(srcs) > 2 else None
    sign = 1.0 if node.op is Op.ROPE else -1.0
    n, h = p.n_dims, p.n_dims // 2
    i0, i1 = (slice(0, h), slice(h, n)) if p.neox else (slice(0, n, 2), slice(1, n, 2))

    def step() -> None:
        c, s = _rope_table(xp, p, pos, ff, sign)
        x0, x1 = x[..., i0], x[..., i1]
        r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
        d[..., n:] = x[..., n:]
        d[..., i0] = r0
        d[..., i1] = r1

    return step


# --- attention ------------------------------------------------------------------------------


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    n_log2 = 1 << int(np.floor(np.log2(F32(n_head))))
    m0 = np.power(F32(2), F32(-max_bias) / F32(n_log2), dtype=F32)
    m1 = np.power(F32(2), F32(-(max_bias / 2.0)) / F32(n_log2), dtype=F32)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1).astype(F32),
                    m1 ** (2 * (h - n_log2) + 1).astype(F32)).astype(F32)


def _softmax_rows(xp, x, d) -> None:
    e = xp.exp(x - x.max(axis=3, keepdims=True))
    d[...] = e * (1.0 / _row_sum(xp, e)).astype(xp.float32)


@register(Op.SOFT_MAX)
def _soft_max_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, p = be.xp, params_of(node, SoftMaxParams)
    a, d = mem(srcs[0]), mem(node)
    s = F32(p.scale)
    if len(srcs) == 1:
        def plain() -> None:
            _softmax_rows(xp, a if s == 1 else a * s, d)

        return plain
    n3, n2, n1, n0 = a.shape
    m = mem(srcs[1])[:, :, :n1, :]
    ga, gm = tile_split((n3, n2), m.shape[:2])
    rest = [(n1,), (n0,)]
    a_split, m_split = split_axes(xp, a, ga + rest), split_axes(xp, m, gm + rest)
    slope = None
    if p.max_bias > 0:
        lead = [1] * len(ga[0])
        slope = xp.asarray(_alibi_slopes(n2, p.max_bias).reshape(lead + list(ga[1]) + [1, 1]))

    def step() -> None:
        mm = m_split if slope is None else slope * m_split
        _softmax_rows(xp, (a_split * s + mm).reshape(a.shape), d)

    return step


@register(Op.SOFT_MAX_BACK)
def _soft_max_back_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, s = be.xp, F32(params_of(node, SoftMaxParams).scale)
    g, y, d = mem(srcs[0]), mem(srcs[1]), mem(node)

    def step() -> None:
        dot = _row_sum(xp, g * y).astype(xp.float32)
        d[...] = ((g - dot) * y) * s

    return step


@register(Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO)
def _diag_mask_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, n_past = be.xp, params_of(node, DiagMaskParams).n_past
    value = F32(-np.inf) if node.op is Op.DIAG_MASK_INF else F32(0)
    a, d = mem(srcs[0]), mem(node)
    n1, n0 = a.shape[2], a.shape[3]
    masked = xp.arange(n0)[None, :] > n_past + xp.arange(n1)[:, None]

    def step() -> None:
        d[...] = xp.where(masked, value, a)

    return step


# --- pointwise ------------------------------------------------------------------------------


@register(Op.GLU)
def _glu_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    xp, d = be.xp, mem(node)
    if len(srcs) == 2:
        x, u = mem(srcs[0]), mem(srcs[1])
    else:
        a, n = mem(srcs[0]), node.ne[0]
        x, u = a[..., :n], a[..., n:]
        if params_of(node, GluParams).swapped:
            x, u = u, x

    def step() -> None:
        d[...] = (x * (F32(1) / (F32(1) + xp.exp(-x)))) * u

    return step


@register(Op.SIN, Op.COS)
def _trig_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    fn = be.xp.sin if node.op is Op.SIN else be.xp.cos
    a, d = mem(srcs[0]), mem(node)
    return lambda: fn(a, out=d)


@register(Op.ADD1)
def _add1_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    add = be.xp.add
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    return lambda: add(a, b, out=d)


# --- concat ---------------------------------------------------------------------------------


@register(Op.CONCAT)
def _concat_c(be: ArrayBackend, node: Tensor, srcs: tuple, mem: Mem) -> Step:
    axis = 3 - params_of(node, ConcatParams).dim
    a, b, d = mem(srcs[0]), mem(srcs[1]), mem(node)
    na = a.shape[axis]
    da = d[(slice(None),) * axis + (slice(0, na),)]
    db = d[(slice(None),) * axis + (slice(na, None),)]

    def step() -> None:
        da[...] = a
        db[...] = b

    return step
