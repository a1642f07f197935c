"""The fine-tune's parameters (:class:`FinetuneParams`): batches, learning rate, weight decay,
held-out share, static or dynamic graphs, seed, compute type and gradient clipping, each
checked by :meth:`FinetuneParams.check`."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import DTypeError, InvalidValueError, ShapeError
from ..models.llama.compute import check_compute_type
from ..opt.checks import check_float32

__all__ = ["FinetuneParams"]


@dataclasses.dataclass(frozen=True)
class FinetuneParams:
    """``n_batch`` windows per optimizer step, in micro-batches of ``n_ubatch`` windows."""

    n_batch: int = 1
    n_ubatch: int = 1
    lr: float = 1e-5
    wd: float = 0.0
    val_split: float = 0.05
    static: bool = True
    seed: int = 5489
    #: "bf16": the F32 weights rounded to BF16 once per micro-batch's graph for their products
    #: (the master copy and AdamW's state stay F32; :mod:`ggopt.models.llama.compute`)
    compute_type: str = "f32"
    #: the largest global L2 norm of an optimizer step's gradients (PyTorch's
    #: ``clip_grad_norm_``; ``OptParams.grad_clip``); None: no clipping
    grad_clip: float | None = None

    def check(self) -> None:
        check_compute_type(self.compute_type, "finetune")
        if self.grad_clip is not None:
            check_float32(self.grad_clip, "grad_clip", "finetune", low=0.0, low_open=True)
        for name in ("n_batch", "n_ubatch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise DTypeError(f"finetune: {name} must be an int, got {v!r}")
        for name in ("lr", "wd", "val_split"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)):
                raise DTypeError(f"finetune: {name} must be a real number, got {v!r}")
        if self.n_batch < 1 or self.n_ubatch < 1 or self.n_batch % self.n_ubatch:
            raise ShapeError(f"finetune: the micro-batch ({self.n_ubatch} windows) must divide "
                             f"the batch ({self.n_batch} windows)")
        if not (self.lr > 0 and 0 <= self.wd <= 1):
            raise ShapeError(f"finetune: expected lr > 0 and 0 <= wd <= 1, got {self.lr}, "
                             f"{self.wd}")
        check_float32(self.lr, "lr", "finetune", low=0.0, low_open=True)
        check_float32(self.wd, "wd", "finetune", low=0.0, high=1.0)
        if not 0.0 <= self.val_split < 1.0:
            raise InvalidValueError(f"finetune: val_split must be in [0, 1), got "
                                    f"{self.val_split}")

    @property
    def opt_period(self) -> int:
        return self.n_batch // self.n_ubatch
