"""Text generation with a KV cache, as llama.cpp decodes: the prompt in chunks of up to
``n_ubatch`` tokens, then one token's work per new token.

The cache has a fixed number of slots (``n_ctx``: the prompt plus the tokens asked for, capped
by the caller's ``--ctx``), so it holds only tokens actually present, and the memory needed is
checked (OutOfMemoryError) before anything is allocated. Each step's graph has a fixed shape:
the new tokens attend to all slots through a mask (-inf on the slots not yet filled, as
llama.cpp's ``kq_mask``), so the one-token graph is built and planned once and then only
recomputed with new inputs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

import ggopt

from ..backend import tensor_get, tensor_set
from ..errors import InvalidValueError, ShapeError, StateError
from ..models.llama.graph import (
    Graph,
    LlamaModel,
    build_graph,
    make_cache,
    make_inputs,
    set_masks,
)
from ..models.llama.loader import Model
from ..models.llama.run import GRAPH_SIZE, check_fits, check_ids, forward_bytes
from .sampling import SamplingParams, sample

__all__ = ["Generator", "GenerateResult", "generate"]

N_UBATCH = 512


class _Step:
    """The graph for ``n_tokens`` new tokens over a cache of ``n_kv`` slots."""

    def __init__(self, gen: Generator, n_tokens: int) -> None:
        net = gen.net
        self.ctx = ggopt.Context()
        self.inputs = make_inputs(net, 1, n_tokens, n_kv=gen.cache.n_kv)
        # ggopt's float order: the cache stages new tokens after its slots, so a step's
        # attention adds them where llama.cpp's does not and ggml's order could not give its
        # bits; it would cost speed (docs/ggml-order.md)
        self.graph: Graph = build_graph(self.ctx, net, self.inputs, gen.cache, last_only=True,
                                        ggml_order=False)
        self.gf = ggopt.new_graph_custom(self.ctx, GRAPH_SIZE, False)
        for write in self.graph.writes:  # layer by layer: each write before its layer reads
            ggopt.build_forward_expand(self.gf, write)
        ggopt.build_forward_expand(self.gf, self.graph.logits)


class Generator:
    """A KV cache of ``n_ctx`` slots for one sequence of ``model``.

    ``feed(ids)`` appends tokens (any number up to the free slots) and returns the logits
    (``[n_vocab]``) after the last one; ``n_past`` counts the tokens in the cache;
    ``reset()`` empties it for a new sequence.
    """

    def __init__(self, model: Model | LlamaModel, n_ctx: int, n_ubatch: int = N_UBATCH) -> None:
        self.net = model.net if isinstance(model, Model) else model
        cfg = self.net.cfg
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
            raise InvalidValueError(f"--ctx: expected a positive int, got {n_ctx!r}")
        self.n_ubatch = max(1, min(n_ubatch, n_ctx))
        check_fits(forward_bytes(cfg, self.n_ubatch, n_ctx),
                   f"a KV cache of --ctx {n_ctx} tokens")
        self.cache = make_cache(self.net, n_ctx, self.n_ubatch)
        self.n_past = 0
        self._steps: dict[int, _Step] = {}
        self._projection = self.net.projection  # what the cached graphs apply

    @property
    def n_ctx(self) -> int:
        return self.cache.n_kv

    def reset(self) -> None:
        """Empty the cache for a new sequence (as llama.cpp clears its KV cache): the next
        ``feed`` starts at position 0 and gives a new Generator's logits, bit for bit, on the
        graphs this one has already built and planned."""
        self.cache.clear()
        self.n_past = 0

    def _step(self, n: int) -> _Step:
        if self.net.projection is not self._projection:  # lora.attach since the graphs
            if self.n_past:
                raise StateError(f"generate: the model's projections changed (lora.attach) "
                                 f"after {self.n_past} tokens were fed; call reset() first")
            self._steps.clear()
            self._projection = self.net.projection
        step = self._steps.get(n)
        if step is None:
            step = self._steps[n] = _Step(self, n)
        if self.net.sched.allocated_graph is not step.gf:  # another step's, or other work's
            self.net.sched.reset()
            self.net.sched.alloc_graph(step.gf)
        return step

    def _run(self, ids: np.ndarray) -> np.ndarray:
        n, first, n_kv = ids.size, self.n_past, self.cache.n_kv
        step = self._step(n)
        mask = np.full((n, n_kv + n), -np.inf, np.float32)
        mask[:, :first] = 0.0
        mask[:, n_kv:] = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        tensor_set(step.inputs.tokens, ids)
        tensor_set(step.inputs.pos, np.arange(first, first + n, dtype=np.int32))
        kv_pos = np.concatenate([np.arange(n_kv), np.arange(first, first + n)])
        set_masks(step.inputs, self.net.cfg, mask, kv_pos, np.arange(first, first + n))
        self.net.sched.graph_compute(step.gf)
        self.cache.store(n, first)
        self.n_past += n
        out: np.ndarray = tensor_get(step.graph.logits).reshape(-1)
        return out

    def feed(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        arr = check_ids(ids, self.net.cfg.n_vocab, "generate")
        if self.n_past + arr.size > self.n_ctx:
            raise ShapeError(f"generate: {arr.size} more tokens do not fit: {self.n_past} of "
                             f"the --ctx {self.n_ctx} slots are used")
        logits = np.empty(0, np.float32)
        for start in range(0, arr.size, self.n_ubatch):
            logits = self._run(arr[start:start + self.n_ubatch])
        return logits


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """The generated ``tokens`` (prompt excluded), why it stopped (``"length"``, ``"eog"``,
    ``"context"``), and the prompt and generation times."""

    tokens: list[int]
    stop: str
    n_prompt: int
    prompt_seconds: float
    gen_seconds: float

    @property
    def tokens_per_second(self) -> float:
        n = len(self.tokens)
        return n / self.gen_seconds if self.gen_seconds > 0 else float("inf")


def generate(model: Model | LlamaModel, prompt: Sequence[int] | np.ndarray, n_predict: int,
             params: SamplingParams | None = None, *, eog: frozenset[int] = frozenset(),
             n_ctx: int | None = None,
             on_token: Callable[[int], None] | None = None) -> GenerateResult:
    """Sample up to ``n_predict`` tokens after ``prompt`` (token ids).

    Stops early at a token of ``eog`` (the model's end-of-generation tokens; kept in the
    result) or when the ``n_ctx`` slots (default: prompt + ``n_predict``, at most the model's
    context length) are full. ``on_token(id)`` is called for each new token.
    """
    params = params or SamplingParams()
    net = model.net if isinstance(model, Model) else model
    ids = check_ids(prompt, net.cfg.n_vocab, "generate: prompt")
    if isinstance(n_predict, bool) or not isinstance(n_predict, int) or n_predict < 1:
        raise InvalidValueError(f"-n: expected a positive int, got {n_predict!r}")
    cap = net.cfg.n_ctx if n_ctx is None else n_ctx
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InvalidValueError(f"--ctx: expected a positive int, got {cap!r}")
    if ids.size >= cap:
        raise ShapeError(f"generate: the prompt has {ids.size} tokens, --ctx {cap} leaves "
                         f"no room to generate")
    gen = Generator(net, min(cap, ids.size + n_predict - 1) or 1)
    rng = np.random.default_rng(params.seed)
    t0 = time.perf_counter()
    logits = gen.feed(ids)
    t1 = time.perf_counter()
    out: list[int] = []
    stop = "length"
    while True:
        token = sample(logits, params, rng)
        out.append(token)
        if on_token is not None:
            on_token(token)
        if token in eog:
            stop = "eog"
            break
        if len(out) == n_predict:
            break
        if gen.n_past == gen.n_ctx:
            stop = "context"
            break
        logits = gen.feed([token])
    return GenerateResult(out, stop, int(ids.size), t1 - t0, time.perf_counter() - t1)
