"""Step-level controls of a fine-tune (what TRL / PEFT users expect): a step budget
(``max_steps``), validation every N optimizer steps, early stopping after ``patience``
evaluations without a better validation loss, the best evaluated state kept (host copies of
the trainable tensors) and restored, and a JSON-lines log, one record per optimizer step::

    {"step": 0, "val_loss": 3.09}                         # before training
    {"step": 1, "epoch": 1, "loss": 3.41, "lr": 1e-4, "tokens_per_s": 231.0}
    {"step": 50, "epoch": 1, "loss": 2.9, "lr": 1e-4, "tokens_per_s": 228.4, "val_loss": 2.81}

:class:`StepMonitor` is called by :class:`ggopt.lm.finetune.FineTuner` after every optimizer
step; it raises :class:`StopTraining` to end the run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import numpy as np

from ..backend import tensor_get, tensor_set
from ..errors import InvalidValueError
from ..tensor import Tensor

__all__ = ["StepControls", "StepMonitor", "StopTraining", "read_log"]


class StopTraining(Exception):
    """A control ended the run (``reason`` says which); the loop stops after a whole step."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class StepControls:
    """``max_steps``: optimizer steps in all (None: the epochs decide); ``eval_every``:
    validate every N steps; ``patience``: stop after that many evaluations without a better
    validation loss (needs validation); ``log``: where the JSON lines go."""

    max_steps: int | None = None
    eval_every: int | None = None
    patience: int | None = None
    log: TextIO | None = None

    def check(self) -> None:
        for name in ("max_steps", "eval_every", "patience"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidValueError(f"finetune controls: {name} must be an int >= 1 or "
                                        f"None, got {v!r}")


class StepMonitor:
    """Applies :class:`StepControls` after every optimizer step.

    ``params()``: the trainable tensors (the best state's copies are theirs);
    ``validate()``: the held-out mean loss; ``say``: where a line per evaluation goes."""

    def __init__(self, controls: StepControls, params: Callable[[], Sequence[Tensor]],
                 validate: Callable[[], float], say: Callable[[str], None] | None = None) -> None:
        controls.check()
        self.controls, self.params, self.validate, self.say = controls, params, validate, say
        self.best_loss = math.inf
        self.best_step = -1
        self.best: list[np.ndarray] | None = None
        self.bad = 0
        self._last_eval = -1
        self._t = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        """One JSON line to the log (if any), flushed."""
        if self.controls.log is not None:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                     for k, v in record.items()}  # JSON has no NaN
            self.controls.log.write(json.dumps(clean) + "\n")
            self.controls.log.flush()

    def evaluated(self, step: int, loss: float) -> None:
        """A validation loss at ``step``: the best state kept when it is the best so far (a
        second evaluation of the same step, at an epoch's end, counts once)."""
        if not math.isfinite(loss) or step == self._last_eval:
            return
        self._last_eval = step
        if loss < self.best_loss:
            self.best_loss, self.best_step, self.bad = loss, step, 0
            self.best = [tensor_get(t).copy() for t in self.params()]
        else:
            self.bad += 1

    def after_step(self, step: int, epoch: int, loss: float, lr: float, n_tokens: int) -> None:
        """Log optimizer step ``step`` (1-based, counted over the run), validate when due, and
        raise StopTraining when the budget or the patience is spent."""
        now = time.perf_counter()
        rate = n_tokens / (now - self._t) if now > self._t else 0.0
        record: dict[str, Any] = {"step": step, "epoch": epoch, "loss": loss, "lr": lr,
                                  "tokens_per_s": round(rate, 1)}
        c = self.controls
        if c.eval_every is not None and step % c.eval_every == 0:
            val = self.validate()
            record["val_loss"] = val
            self.evaluated(step, val)
            if self.say is not None and math.isfinite(val):
                self.say(f"step {step}: val loss={val:.4f} ppl={math.exp(val):.3f} (best "
                         f"{self.best_loss:.4f} at step {self.best_step})")
        self.write(record)
        self._t = time.perf_counter()  # validation time is not training time
        if c.patience is not None and self.bad >= c.patience:
            raise StopTraining(f"early stopping at step {step}: no better validation loss in "
                               f"{c.patience} evaluations (best {self.best_loss:.4f} at step "
                               f"{self.best_step})")
        if c.max_steps is not None and step >= c.max_steps:
            raise StopTraining(f"--max-steps {c.max_steps} reached")

    def restore_best(self) -> bool:
        """Put the best evaluated state back into the trainable tensors; False when no
        evaluation was finite."""
        if self.best is None:
            return False
        for t, arr in zip(self.params(), self.best, strict=True):
            tensor_set(t, arr)
        return True


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines log (InvalidValueError naming a bad line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise InvalidValueError(f"log {path!r}: line {n} is not JSON: {exc}") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                raise InvalidValueError(f"log {path!r}: line {n}: expected an object with an "
                                        f"int 'step'")
            out.append(rec)
    return out
