"""Rotary-embedding array compilers: ggml's angles (float32, the base's power by repeated
multiplication, YaRN's ramp), rotation of adjacent pairs or halves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....ops._base import params_of
from ....ops.rope import RopeParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, F32, Srcs

if TYPE_CHECKING:
    from ..backend import ArrayBackend


def _corr_dims(p: RopeParams) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32 (log of 0 or of a negative gives -inf/NaN as in C)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        def dim(n_rot: float) -> float:
            ratio = F32(p.n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi))
            return float(F32(p.n_dims) * np.log(ratio) / (F32(2) * np.log(F32(p.freq_base))))

        start = float(np.floor(dim(p.beta_fast)))
        end = float(np.ceil(dim(p.beta_slow)))
    return max(0.0, start), min(float(p.n_dims - 1), end)


def _rope_table(xp: Any, p: RopeParams, pos: Any, ff: Any, sign: float) -> tuple[Any, Any]:
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


@COMPILERS.register(Op.ROPE, Op.ROPE_BACK)
def _rope_c(be: ArrayBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
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
