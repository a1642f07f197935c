"""Learning-rate schedules: optimizer-params callbacks of ggml's shape that know their position.

A schedule is called like ggml's ``get_opt_pars(userdata)`` once per optimizer step and
returns :class:`OptimizerParams` whose ``adamw.alpha`` and ``sgd.alpha`` are the scheduled
learning rate (the other hyperparameters come from ``base``). It counts its own calls
(:attr:`Schedule.step`) and keeps the current epoch (:attr:`Schedule.epoch`, 0-based), so a
checkpoint holds its position and a resumed run continues the same curve.

- With :func:`fit` pass the schedule as ``get_opt_pars``: fit calls it with its 1-based epoch
  number (ggml's ``ggml_opt_fit`` passes a pointer to its epoch counter), which sets
  :attr:`~Schedule.epoch`.
- In hand-written loops set it as ``OptParams.get_opt_pars`` and, for epoch-wise schedules,
  assign ``schedule.epoch`` at the start of every epoch (userdata that is not an int is
  ignored).

torch equivalents: :func:`constant` is a fixed ``lr``; :func:`epoch_decay` a ``LambdaLR``
stepped per epoch; :func:`warmup_cosine` a ``LinearLR`` warm-up chained with
``CosineAnnealingLR``, stepped per optimizer step.
"""

from __future__ import annotations

import abc
import copy
import math
from typing import ClassVar

import numpy as np

from ..errors import DTypeError, InvalidValueError
from .checks import check_float32
from .params import OptimizerParams

__all__ = ["Schedule", "ConstantLR", "EpochDecayLR", "WarmupCosineLR", "constant",
           "epoch_decay", "warmup_cosine"]


def _real(value: object, name: str, where: str, positive: bool = False) -> float:
    """``value`` checked as the float32 the optimizer computes with (>= 0, or > 0)."""
    return check_float32(value, name, where, low=0.0, low_open=positive)


def _count(value: object, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DTypeError(f"{where}: {name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidValueError(f"{where}: {name} must be >= 0, got {value}")
    return int(value)


class Schedule(abc.ABC):
    """Base class: the learning rate as a function of optimizer step and epoch.

    Subclasses set :attr:`kind` and implement :meth:`lr_at` and :meth:`hyperparameters`.

    Attributes
    ----------
    step : int
        Optimizer steps taken so far (calls of the schedule); the next call uses this step.
    epoch : int
        0-based index of the current epoch.
    """

    kind: ClassVar[str] = ""

    def __init__(self, base: OptimizerParams | None = None) -> None:
        if base is not None and not isinstance(base, OptimizerParams):
            raise DTypeError(
                f"{self.kind}: base must be an OptimizerParams or None, got {type(base).__name__}"
            )
        self._base = OptimizerParams() if base is None else copy.deepcopy(base)
        self._base.check(f"{self.kind} schedule: base")
        self.step = 0
        self.epoch = 0

    @abc.abstractmethod
    def lr_at(self, step: int, epoch: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) in epoch ``epoch`` (0-based)."""

    @abc.abstractmethod
    def hyperparameters(self) -> dict[str, float | int]:
        """The constants that define the curve (stored in checkpoints and compared on load)."""

    def check_run(self, nepoch: int, steps_per_epoch: int, where: str) -> None:
        """Raise InvalidValueError unless every rate of a run of ``nepoch`` epochs of
        ``steps_per_epoch`` optimizer steps is a usable float32 (> 0, not flushed to zero).

        The rate is lowest at the first step (warm-up) or the last (decay), so those two are
        checked. Changes nothing.
        """
        if nepoch < 1 or steps_per_epoch < 1:
            return
        last = nepoch * steps_per_epoch - 1
        for step, epoch in ((0, 0), (last, nepoch - 1)):
            _real(self.lr_at(step, epoch), f"the {self.kind} learning rate of optimizer step "
                  f"{step + 1} (epoch {epoch + 1})", where, positive=True)

    @property
    def lr(self) -> float:
        """The learning rate the next call returns."""
        return self.lr_at(self.step, self.epoch)

    def __call__(self, userdata: object = None) -> OptimizerParams:
        """Return the next step's hyperparameters and advance :attr:`step` by one.

        ``userdata``: an int is :func:`fit`'s 1-based epoch number and sets :attr:`epoch` to
        ``userdata - 1``; anything else is ignored.
        """
        if isinstance(userdata, (int, np.integer)) and not isinstance(userdata, bool):
            self.epoch = max(int(userdata) - 1, 0)
        lr = self.lr_at(self.step, self.epoch)
        self.step += 1
        pars = copy.deepcopy(self._base)
        pars.adamw.alpha = pars.sgd.alpha = lr
        return pars

    # --- checkpoints ------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        """Kind, hyperparameters and position, as checkpoint metadata values."""
        return {"kind": self.kind, "step": self.step, "epoch": self.epoch,
                **self.hyperparameters()}

    def check_state(self, state: dict[str, object], where: str) -> tuple[int, int]:
        """Raise InvalidValueError unless ``state`` (from :meth:`state`) is this schedule's curve;
        return its ``(step, epoch)``. Changes nothing."""
        if state.get("kind") != self.kind:
            raise InvalidValueError(f"{where}: schedule: expected {self.kind!r}, the file holds "
                                    f"{state.get('kind')!r}")
        for name, value in self.hyperparameters().items():
            if state.get(name) != value:
                raise InvalidValueError(f"{where}: schedule {self.kind} {name}: expected "
                                        f"{value!r}, the file holds {state.get(name)!r}")
        return (_count(state.get("step"), "schedule step", where),
                _count(state.get("epoch"), "schedule epoch", where))

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters().items())
        return f"{type(self).__name__}({hp}; step={self.step}, epoch={self.epoch})"


class ConstantLR(Schedule):
    """The same learning rate ``lr`` at every step."""

    kind = "constant"

    def __init__(self, lr: float, base: OptimizerParams | None = None) -> None:
        where = "constant schedule"
        self.lr0 = _real(lr, "lr", where, positive=True)
        super().__init__(base)

    def lr_at(self, step: int, epoch: int) -> float:
        return self.lr0

    def hyperparameters(self) -> dict[str, float | int]:
        return {"lr0": self.lr0}


class EpochDecayLR(Schedule):
    """llama.cpp finetune's epoch-wise decay: ``max(lr_min, lr0 * 0.5**(epoch/decay_epochs))``.

    The rate halves every ``decay_epochs`` epochs (fractional values allowed), constant within
    an epoch, and never drops below ``lr_min``.
    """

    kind = "epoch_decay"

    def __init__(self, lr0: float, decay_epochs: float, lr_min: float = 0.0,
                 base: OptimizerParams | None = None) -> None:
        where = "epoch_decay schedule"
        self.lr0 = _real(lr0, "lr0", where, positive=True)
        self.decay_epochs = _real(decay_epochs, "decay_epochs", where, positive=True)
        self.lr_min = _real(lr_min, "lr_min", where)
        if not 0 <= self.lr_min <= self.lr0:
            raise InvalidValueError(f"{where}: lr_min must be in [0, lr0={self.lr0}], got "
                                    f"{self.lr_min}")
        super().__init__(base)

    def lr_at(self, step: int, epoch: int) -> float:
        decayed: float = self.lr0 * 0.5 ** (epoch / self.decay_epochs)
        return max(self.lr_min, decayed)

    def hyperparameters(self) -> dict[str, float | int]:
        return {"lr0": self.lr0, "decay_epochs": self.decay_epochs, "lr_min": self.lr_min}


class WarmupCosineLR(Schedule):
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``lr_min`` at ``total_steps``.

    Step ``s`` (0-based): ``lr0 * (s + 1) / warmup`` while ``s < warmup``; then with
    ``p = (s - warmup) / (total_steps - warmup)``, ``lr_min + (lr0 - lr_min) * (1 + cos(pi p))
    / 2``; from ``total_steps`` on, ``lr_min``. Every step before ``total_steps`` has a rate
    above ``lr_min``; a longer run with ``lr_min = 0`` is refused by :meth:`~Schedule.check_run`
    (:func:`fit` and the example CLIs call it before training).
    """

    kind = "warmup_cosine"

    def __init__(self, lr0: float, total_steps: int, warmup: int = 0, lr_min: float = 0.0,
                 base: OptimizerParams | None = None) -> None:
        where = "warmup_cosine schedule"
        self.lr0 = _real(lr0, "lr0", where, positive=True)
        self.lr_min = _real(lr_min, "lr_min", where)
        self.total_steps = _count(total_steps, "total_steps", where)
        self.warmup = _count(warmup, "warmup", where)
        if not 0 <= self.lr_min < self.lr0:
            raise InvalidValueError(f"{where}: lr_min must be in [0, lr0={self.lr0}), got "
                                    f"{self.lr_min}")
        if self.total_steps <= self.warmup:
            raise InvalidValueError(f"{where}: total_steps must exceed warmup, got total_steps="
                                    f"{self.total_steps}, warmup={self.warmup}")
        # The lowest rates of the run: the first warm-up step and the last cosine step.
        for step in (0, self.total_steps - 1):
            _real(self.lr_at(step, 0), f"the learning rate of step {step}", where,
                  positive=True)
        super().__init__(base)

    def lr_at(self, step: int, epoch: int) -> float:
        if step < self.warmup:
            return self.lr0 * (step + 1) / self.warmup
        if step >= self.total_steps:
            return self.lr_min
        progress = (step - self.warmup) / (self.total_steps - self.warmup)
        # Written to give exactly lr0 at the peak: lr0 - (lr0 - lr_min) * (1 - cos(pi p)) / 2.
        return self.lr0 - (self.lr0 - self.lr_min) * 0.5 * (1.0 - math.cos(math.pi * progress))

    def hyperparameters(self) -> dict[str, float | int]:
        return {"lr0": self.lr0, "lr_min": self.lr_min, "total_steps": self.total_steps,
                "warmup": self.warmup}


def constant(lr: float, base: OptimizerParams | None = None) -> ConstantLR:
    """A constant learning rate (``base`` supplies betas, eps and weight decay)."""
    return ConstantLR(lr, base)


def epoch_decay(lr0: float, decay_epochs: float, lr_min: float = 0.0,
                base: OptimizerParams | None = None) -> EpochDecayLR:
    """llama.cpp finetune's decay ``max(lr_min, lr0 * 0.5**(epoch/decay_epochs))``."""
    return EpochDecayLR(lr0, decay_epochs, lr_min, base)


def warmup_cosine(lr0: float, total_steps: int, warmup: int = 0, lr_min: float = 0.0,
                  base: OptimizerParams | None = None) -> WarmupCosineLR:
    """Linear warm-up for ``warmup`` optimizer steps, then cosine decay to ``lr_min``."""
    return WarmupCosineLR(lr0, total_steps, warmup, lr_min, base)
