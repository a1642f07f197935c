"""Perplexity the way llama.cpp's ``llama-perplexity`` computes it.

The tokens (the text tokenized with the model's BOS rule) are cut into ``len // n_ctx``
non-overlapping windows of ``n_ctx``; at least two are needed. When the vocabulary adds a BOS
token, each window's first token is replaced by BOS. Each window is evaluated from position 0
and only its second half is scored: the logits at positions ``n_ctx/2 .. n_ctx-2`` predict
tokens ``n_ctx/2+1 .. n_ctx-1``. The result is ``exp`` of the mean negative log-likelihood,
with llama-perplexity's uncertainty ``ppl * sqrt(var(nll) / (n - 1))``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import InvalidValueError, ShapeError
from ..models.llama.loader import Model
from ..models.llama.run import Forward, check_ids

__all__ = ["PerplexityResult", "perplexity"]


@dataclasses.dataclass(frozen=True)
class PerplexityResult:
    """``ppl`` +- ``ppl_err`` over ``n_scored`` tokens of ``n_chunks`` windows; ``nll`` the
    mean negative log-likelihood (nats per token); ``seconds`` of evaluation."""

    ppl: float
    ppl_err: float
    nll: float
    n_scored: int
    n_chunks: int
    n_ctx: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.n_chunks * self.n_ctx / self.seconds if self.seconds > 0 else math.inf


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-row ``-log softmax(logits)[target]`` in float64."""
    z = logits.astype(np.float64)
    zmax = z.max(-1, keepdims=True)
    lse = np.log(np.exp(z - zmax).sum(-1)) + zmax[:, 0]
    nll: np.ndarray = lse - z[np.arange(len(targets)), targets]
    return nll


def perplexity(model: Model, tokens: Sequence[int] | np.ndarray, n_ctx: int, *,
               bos: int | None = None,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """llama-perplexity's perplexity of ``tokens`` in windows of ``n_ctx``.

    ``bos``: the BOS id replacing each window's first token (llama-perplexity does this when
    the vocabulary's ``add_bos`` is set), None for none. ``progress(i, n, ppl_so_far)`` is
    called after each window.
    """
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 4:
        raise InvalidValueError(f"perplexity: --ctx must be an int >= 4, got {n_ctx!r}")
    ids = check_ids(tokens, model.cfg.n_vocab, "perplexity") if len(tokens) else \
        np.zeros(0, np.int32)
    n_chunks = len(ids) // n_ctx
    if n_chunks < 2:
        raise ShapeError(f"perplexity: too few tokens: {len(ids)}; windows of --ctx {n_ctx} "
                         f"need at least {2 * n_ctx} tokens")
    if bos is not None:
        check_ids([bos], model.cfg.n_vocab, "perplexity: bos")
    fwd = Forward(model.net, n_ctx)
    first = n_ctx // 2
    nlls: list[np.ndarray] = []
    t0 = time.perf_counter()
    for i in range(n_chunks):
        window = ids[i * n_ctx:(i + 1) * n_ctx].copy()
        if bos is not None:
            window[0] = bos
        z = fwd.run(window)
        nlls.append(_nll(z[first:n_ctx - 1], ids[i * n_ctx + first + 1:(i + 1) * n_ctx]))
        if progress is not None:
            done = np.concatenate(nlls)
            progress(i + 1, n_chunks, math.exp(done.mean()))
    seconds = time.perf_counter() - t0
    all_nll = np.concatenate(nlls)
    mean = float(all_nll.mean())
    n = all_nll.size
    var = float((all_nll * all_nll).mean()) - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(max(var, 0.0) / (n - 1)) if n > 1 else 0.0
    return PerplexityResult(ppl, err, mean, n, n_chunks, n_ctx, seconds)
