"""Choosing the next token from logits, as llama.cpp's default sampler chain: top-k, then
top-p (on the probabilities of the unscaled logits), then temperature, then a draw.

Rules (checked when the parameters are made, naming the option): ``temp`` is 0 (greedy: the
most likely token, ties to the lowest id) or a finite value of at least the smallest normal
float32 (1.2e-38); a negative temperature is refused rather than read as greedy. ``top_k`` >= 0
(0 = all tokens), ``0 < top_p <= 1`` (1 = off), ``seed`` in 0 .. 2**32-1 (llama.cpp's
uint32 seed; its -1 "random seed" is refused: pass a seed).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import InvalidValueError

__all__ = ["SamplingParams", "sample", "MIN_TEMP"]

MIN_TEMP = float(np.finfo(np.float32).tiny)


def _number(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidValueError(f"{option}: expected a number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """``temp`` 0 = greedy; ``top_k`` 0 = all; ``top_p`` 1 = off; ``seed`` of the draws."""

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        temp = _number("--temp", self.temp)
        if not math.isfinite(temp) or temp < 0:
            raise InvalidValueError(f"--temp: expected 0 (greedy) or a finite positive "
                                    f"temperature, got {self.temp!r}")
        if 0 < temp < MIN_TEMP:
            raise InvalidValueError(f"--temp: {self.temp!r} is below the smallest normal "
                                    f"float32 ({MIN_TEMP:.3g}); use 0 for greedy sampling")
        top_p = _number("--top-p", self.top_p)
        if not (0 < top_p <= 1):
            raise InvalidValueError(f"--top-p: expected 0 < p <= 1, got {self.top_p!r}")
        for option, value, limit in (("--top-k", self.top_k, None),
                                     ("--seed", self.seed, 2**32 - 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    value < 0 or (limit is not None and value > limit):
                bound = "" if limit is None else f" and <= {limit}"
                raise InvalidValueError(f"{option}: expected an integer >= 0{bound}, got "
                                        f"{value!r}")

    @property
    def greedy(self) -> bool:
        return self.temp == 0


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from ``logits`` (``[n_vocab]``) under ``params``."""
    z = np.asarray(logits, np.float64).reshape(-1)
    if not np.isfinite(z).all():
        raise InvalidValueError("sample: the logits hold NaN or infinite values")
    if params.greedy:
        return int(np.argmax(z))
    order = np.argsort(-z, kind="stable")
    if 0 < params.top_k < z.size:
        order = order[:params.top_k]
    if params.top_p < 1:
        p = np.exp(z[order] - z[order[0]])
        cum = np.cumsum(p / p.sum())
        keep = int(np.searchsorted(cum, params.top_p)) + 1  # smallest set reaching top_p
        order = order[:max(1, keep)]
    scaled = z[order] / params.temp
    p = np.exp(scaled - scaled.max())
    return int(order[rng.choice(order.size, p=p / p.sum())])
