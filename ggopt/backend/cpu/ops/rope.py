"""Rotary-embedding compilers (kernel: ``_kernels/_rope.pyx``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ggopt._kernels._rope as _rope

from ....ops._base import params_of
from ....ops.rope import RopeParams
from ....tensor import Op, Tensor
from ...base import Placement, Step
from ._base import COMPILERS, Srcs

if TYPE_CHECKING:
    from ..backend import CPUBackend


@COMPILERS.register(Op.ROPE, Op.ROPE_BACK)
def _rope_c(be: CPUBackend, node: Tensor, srcs: Srcs, mem: Placement) -> Step:
    p = params_of(node, RopeParams)
    x, pos, d = mem(srcs[0]), mem(srcs[1])[0, 0, 0], mem(node)
    ff = mem(srcs[2])[0, 0, 0] if len(srcs) > 2 else None
    sign = 1.0 if node.op is Op.ROPE else -1.0
    return lambda: _rope.rope(x, pos, ff, d, p.n_dims, p.neox, p.n_ctx_orig, p.freq_base,
                              p.freq_scale, p.ext_factor, p.attn_factor, p.beta_fast,
                              p.beta_slow, sign, be.n_threads, p.ggml_order)
