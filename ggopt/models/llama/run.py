"""Running a loaded llama forward: the logits of a token sequence, and memory estimates that
refuse (OutOfMemoryError) what cannot fit before anything is allocated."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

import ggopt

from ...backend import tensor_get, tensor_set
from ...errors import InvalidValueError, OutOfMemoryError
from .config import Config
from .graph import LlamaModel, build_graph, make_inputs
from .loader import Model

__all__ = ["available_memory", "check_fits", "forward_bytes", "check_ids", "Forward", "logits"]

GRAPH_SIZE = 16384


def available_memory() -> int:
    """Bytes this machine can still give (``MemAvailable``; the physical memory otherwise)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def forward_bytes(cfg: Config, n_tokens: int, n_kv: int = 0) -> int:
    """An upper estimate of the compute memory of one forward over ``n_tokens`` new tokens
    attending to ``n_kv`` cached slots: attention scores and their softmax, the activations
    of a block, the logits, and a cache of ``n_kv`` slots."""
    width = n_kv + n_tokens
    scores = 2 * cfg.n_head * width * n_tokens
    acts = n_tokens * (8 * cfg.n_embd + 3 * cfg.n_ff + cfg.n_vocab) + 4 * width * cfg.n_embd_kv
    cache = 2 * cfg.n_layer * n_kv * cfg.n_embd_kv
    return 4 * (scores + acts + cache)


def check_fits(nbytes: int, what: str) -> None:
    """OutOfMemoryError naming ``what`` when ``nbytes`` exceed the available memory."""
    free = available_memory()
    if nbytes > free:
        raise OutOfMemoryError(f"{what}: needs about {nbytes / 2**30:.2f} GiB, "
                               f"{free / 2**30:.2f} GiB available")


def check_ids(ids: Sequence[int] | np.ndarray, n_vocab: int, what: str) -> np.ndarray:
    """``ids`` as a non-empty 1-D int32 array of token ids below ``n_vocab``."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidValueError(f"{what}: expected a non-empty sequence of token ids, got "
                                f"shape {arr.shape} {arr.dtype}")
    bad = arr[(arr < 0) | (arr >= n_vocab)]
    if bad.size:
        raise InvalidValueError(f"{what}: token ids {bad[:5].tolist()} outside the "
                                f"vocabulary 0..{n_vocab - 1}")
    return arr.astype(np.int32)


class Forward:
    """One static graph computing the logits of ``n_tokens`` tokens at positions 0, 1, ...

    ``run(ids)`` -> ``[n_tokens, n_vocab]`` float32. The graph is built and its memory
    planned once; every call only sets the tokens and computes.
    """

    def __init__(self, net: LlamaModel, n_tokens: int) -> None:
        cfg = net.cfg
        check_fits(forward_bytes(cfg, n_tokens), f"a forward over {n_tokens} tokens")
        self.net, self.n_tokens = net, n_tokens
        self.ctx = ggopt.Context()
        self.inputs = make_inputs(net, 1, n_tokens)
        self.graph = build_graph(self.ctx, net, self.inputs)
        self.gf = ggopt.new_graph_custom(self.ctx, GRAPH_SIZE, False)
        ggopt.build_forward_expand(self.gf, self.graph.logits)

    def run(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        arr = check_ids(ids, self.net.cfg.n_vocab, "forward")
        if arr.size != self.n_tokens:
            raise InvalidValueError(f"forward: expected {self.n_tokens} token ids, got "
                                    f"{arr.size}")
        sched = self.net.sched
        sched.reset()
        sched.alloc_graph(self.gf)
        tensor_set(self.inputs.tokens, arr)
        sched.graph_compute(self.gf)
        out: np.ndarray = tensor_get(self.graph.logits).reshape(self.n_tokens, -1)
        return out


def logits(model: Model | LlamaModel, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The logits ``[len(ids), n_vocab]`` (float32) of the token sequence ``ids`` (one
    sequence, positions from 0, causal attention)."""
    net = model.net if isinstance(model, Model) else model
    arr = check_ids(ids, net.cfg.n_vocab, "logits")
    return Forward(net, int(arr.size)).run(arr)
