"""LoRA dropout during training (PEFT's ``lora_dropout``): ``y = W x + s B (A (m * x))``.

Every adapted projection has its own mask input ``m`` ``[n_in, N]`` (F32, 0 or ``1/(1-p)``,
inverted dropout), multiplied into the adapter's input only, never into ``W x``. The masks are
filled on the host for every training micro-batch from a generator keyed by ``(seed,
optimizer step, micro-batch id)``: the optimizer step is the context's own counter (part of
its checkpoint), so a resumed run, mid-epoch too, draws the masks of an uninterrupted one, on
any thread count and rank count. Evaluation fills them with ones (``x * 1`` is ``x``: the
bits of the graph without dropout). Memory: ``4 N sum(n_in)`` bytes over the adapted weights.
"""

from __future__ import annotations

import numpy as np

import ggopt

from .. import F32, Context, Tensor
from ..backend import alloc_ctx_tensors, tensor_set
from ..models.llama import LlamaModel
from .lora import LoraAdapter, check_dropout

__all__ = ["DropoutMasks"]

#: Mixed into the generator's key, apart from the seed's other uses (the shuffle).
_STREAM = 0x10DA


class DropoutMasks:
    """The mask inputs of one micro-batch shape (``n_rows`` tokens) for ``adapter``'s
    weights, allocated on ``net``'s first backend."""

    def __init__(self, net: LlamaModel, adapter: LoraAdapter, n_rows: int, seed: int) -> None:
        self.adapter, self.seed = adapter, seed
        self.p = check_dropout(adapter.dropout, "lora dropout")
        self.ctx = Context()
        self.masks: dict[str, Tensor] = {}
        for name, a in adapter.a.items():
            t = self.ctx.new_tensor_2d(F32, a.ne[0], n_rows)
            ggopt.set_input(ggopt.set_name(t, name + ".lora_dropout"))
            self.masks[name] = t
        alloc_ctx_tensors(self.ctx, net.sched.get_backend(0))
        self._ones = False

    def nbytes(self) -> int:
        return sum(4 * t.nelements() for t in self.masks.values())

    def project(self, ctx: Context, name: str, w: Tensor, x: Tensor) -> Tensor:
        """The adapter's projection with ``x`` masked on the adapter's path only."""
        mask = self.masks.get(name)
        return self.adapter.project(ctx, name, w, x,
                                    None if mask is None else ggopt.mul(ctx, x, mask))

    def draw(self, step: int, ibatch: int) -> dict[str, np.ndarray]:
        """The masks ``(n_rows, n_in)`` of training micro-batch ``ibatch`` of optimizer step
        ``step``."""
        rng = np.random.default_rng([self.seed, step, ibatch, _STREAM])
        keep = np.float32(1.0 / (1.0 - self.p))
        out = {}
        for name, t in self.masks.items():
            u = rng.random((t.ne[1], t.ne[0]), np.float32)
            out[name] = np.where(u >= np.float32(self.p), keep, np.float32(0.0))
        return out

    def fill(self, step: int, ibatch: int) -> None:
        """Set the masks of a training micro-batch (:meth:`draw`)."""
        for name, m in self.draw(step, ibatch).items():
            tensor_set(self.masks[name], m)
        self._ones = False

    def fill_ones(self) -> None:
        """Every mask 1 (evaluation: no dropout)."""
        if not self._ones:
            for t in self.masks.values():
                tensor_set(t, np.ones((t.ne[1], t.ne[0]), np.float32))
            self._ones = True
