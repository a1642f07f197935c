"""Training and evaluation of the llama example, as llama.cpp's ``llama_opt_epoch``.

Per micro-batch (``n_ubatch`` sequences) a fresh compute context and forward graph are built,
then ``prepare_alloc`` -> ``alloc(train)`` -> tokens and one-hot labels set -> ``eval``; an
optimizer step happens every ``opt_period = n_batch / n_ubatch`` micro-batches. With
``static=True`` the same model is trained through one static graph built up front (ggml's
``ggml_opt_epoch`` path); both give bit-identical weights.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TextIO

import numpy as np

import ggopt

from ..backend import tensor_get, tensor_set
from ..errors import ShapeError
from ..opt import (
    BuildType,
    Dataset,
    FitHistory,
    LossType,
    OptContext,
    OptimizerParams,
    Result,
    default_params,
    epoch_callback_progress_bar,
)
from ..opt.progress import time_us
from .llm_model import Inputs, LlamaModel, build_logits, make_inputs

__all__ = ["TrainParams", "Timing", "Trainer", "bits_per_byte", "evaluate"]

LN2 = math.log(2.0)


def bits_per_byte(loss: float) -> float:
    """Cross-entropy in nats per byte-token -> bits per byte."""
    return loss / LN2


@dataclasses.dataclass(frozen=True)
class TrainParams:
    """``n_batch`` sequences per optimizer step in micro-batches of ``n_ubatch`` sequences."""

    n_batch: int = 16
    n_ubatch: int = 16
    lr: float = 3e-3
    wd: float = 0.0
    val_split: float = 0.05
    static: bool = False

    @property
    def opt_period(self) -> int:
        return self.n_batch // self.n_ubatch

    def check(self) -> None:
        if self.n_batch < 1 or self.n_ubatch < 1 or self.n_batch % self.n_ubatch:
            raise ShapeError(f"llm train: the micro-batch ({self.n_ubatch} sequences) must "
                             f"divide the batch ({self.n_batch} sequences)")
        if not 0.0 <= self.val_split < 1.0:
            raise ShapeError(f"llm train: val_split must be in [0, 1), got {self.val_split}")
        if not (self.lr > 0 and 0 <= self.wd <= 1):
            raise ShapeError(f"llm train: expected lr > 0 and 0 <= wd <= 1, got {self.lr}, "
                             f"{self.wd}")


@dataclasses.dataclass
class Timing:
    """Where the time of training micro-batches went (seconds, summed)."""

    n: int = 0
    build: float = 0.0  # compute context + graph + prepare_alloc + alloc
    total: float = 0.0  # the whole micro-batch: build, inputs, eval

    @property
    def build_share(self) -> float:
        return self.build / self.total if self.total else math.nan


def _one_hot(labels: np.ndarray, n_vocab: int) -> np.ndarray:
    out = np.zeros((labels.size, n_vocab), np.float32)
    out[np.arange(labels.size), labels.reshape(-1)] = 1.0
    return out


class Trainer:
    """An optimization context over ``model`` with its micro-batch inputs."""

    def __init__(self, model: LlamaModel, tp: TrainParams, seed: int = 5489) -> None:
        tp.check()
        self.model, self.tp = model, tp
        self.inp: Inputs = make_inputs(model, tp.n_ubatch)
        params = default_params(model.sched, LossType.CROSS_ENTROPY)
        params.opt_period = tp.opt_period
        params.rng_seed = seed
        opt_pars = OptimizerParams()
        opt_pars.adamw.alpha, opt_pars.adamw.wd = tp.lr, tp.wd
        params.get_opt_pars = lambda _ud: opt_pars
        if tp.static:
            params.ctx_compute = ggopt.Context()
            params.inputs = self.inp.tokens
            params.outputs = build_logits(params.ctx_compute, model, self.inp)
        self.opt_ctx = OptContext(params)
        self.timing = Timing()
        n = model.cfg.n_ctx * tp.n_ubatch
        self._tokens = np.empty((tp.n_ubatch, model.cfg.n_ctx), np.int32)
        self._labels = np.empty((tp.n_ubatch, model.cfg.n_ctx), np.int32)
        self._n = n

    def split(self, dataset: Dataset) -> tuple[int, int]:
        """``(training micro-batches, validation micro-batches)`` of ``dataset``."""
        tp = self.tp
        nub = dataset.ndata // tp.n_ubatch
        ntrain = int(nub * (1.0 - tp.val_split))
        ntrain -= ntrain % tp.opt_period
        if ntrain < 1:
            raise ShapeError(
                f"llm train: {dataset.ndata} windows give {nub} micro-batches of "
                f"{tp.n_ubatch}, {int(nub * (1.0 - tp.val_split))} for training; expected at "
                f"least one batch of {tp.n_batch} sequences (more text or a smaller --batch)")
        return ntrain, nub - ntrain

    def _microbatch(self, dataset: Dataset, ibatch: int, train: bool, result: Result) -> None:
        t0 = time.perf_counter()
        if not self.tp.static:
            ctx = ggopt.Context()
            logits = build_logits(ctx, self.model, self.inp)
            gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, True)
            ggopt.build_forward_expand(gf, logits)
            self.opt_ctx.prepare_alloc(ctx, gf, self.inp.tokens, logits)
        self.opt_ctx.alloc(train)
        t1 = time.perf_counter()
        dataset.get_batch_host(self._tokens, self._labels, ibatch)
        tensor_set(self.inp.tokens, self._tokens.reshape(-1))
        tensor_set(self.opt_ctx.labels, _one_hot(self._labels, self.model.cfg.n_vocab))
        self.opt_ctx.eval(result)
        if train:
            t2 = time.perf_counter()
            self.timing.n += 1
            self.timing.build += t1 - t0
            self.timing.total += t2 - t0

    def epoch(self, dataset: Dataset, result_train: Result, result_val: Result,
              progress: TextIO | None = None, silent: bool = False) -> None:
        """Shuffle the training windows, train on them, evaluate the validation windows."""
        ntrain, nval = self.split(dataset)
        dataset.shuffle(self.opt_ctx, ntrain * self.tp.n_ubatch)
        for part, first, count, result in ((True, 0, ntrain, result_train),
                                           (False, ntrain, nval, result_val)):
            t_start = time_us()
            for i in range(count):
                self._microbatch(dataset, first + i, part, result)
                if not silent:
                    epoch_callback_progress_bar(part, self.opt_ctx, dataset, result, i + 1,
                                                count, t_start, stream=progress)

    def fit(self, dataset: Dataset, nepoch: int, silent: bool = False,
            stream: TextIO | None = None) -> FitHistory:
        """``nepoch`` epochs; returns the per-epoch statistics, printing one line per epoch."""
        history = FitHistory()
        for iepoch in range(nepoch):
            t0 = time.perf_counter()
            train, val = Result(), Result()
            self.epoch(dataset, train, val, progress=stream, silent=silent)
            record(history, train, val, time.perf_counter() - t0)
            if not silent:
                print(epoch_line(iepoch + 1, train, val), file=stream, flush=True)
        return history

    def close(self) -> None:
        self.opt_ctx.close()


def record(history: FitHistory, train: Result, val: Result, seconds: float) -> None:
    """Append one epoch's losses and accuracies (NaN for an empty part)."""
    for prefix, result in (("train", train), ("val", val)):
        stats = (*result.loss(), *result.accuracy()) if result.ndata else (math.nan,) * 4
        for name, value in zip(("loss", "loss_unc", "acc", "acc_unc"), stats, strict=True):
            getattr(history, f"{prefix}_{name}").append(value)
    history.seconds.append(seconds)


def epoch_line(iepoch: int, train: Result, val: Result) -> str:
    """``epoch N: train loss .. acc .. ppl .. bpb .. | val ...``."""
    parts = [f"epoch {iepoch}:"]
    for name, r in (("train", train), ("val", val)):
        if r.ndata == 0:
            continue
        loss, acc = r.loss()[0], r.accuracy()[0]
        parts.append(f"{name} loss={loss:.4f} acc={100 * acc:.2f}% ppl={math.exp(loss):.3f} "
                     f"bits/byte={bits_per_byte(loss):.4f}")
    return " ".join(parts[:2]) + "".join(f" | {p}" for p in parts[2:])


def evaluate(model: LlamaModel, dataset: Dataset, n_ubatch: int = 1) -> Result:
    """Forward-only cross-entropy over every window of ``dataset`` (static graph)."""
    inp = make_inputs(model, n_ubatch)
    params = default_params(model.sched, LossType.CROSS_ENTROPY)
    params.build_type = BuildType.FORWARD
    params.ctx_compute = ggopt.Context()
    params.inputs = inp.tokens
    params.outputs = build_logits(params.ctx_compute, model, inp)
    tokens = np.empty((n_ubatch, model.cfg.n_ctx), np.int32)
    labels = np.empty_like(tokens)
    result = Result()
    with OptContext(params) as opt_ctx:
        for ibatch in range(dataset.ndata // n_ubatch):
            opt_ctx.alloc(False)
            dataset.get_batch_host(tokens, labels, ibatch)
            tensor_set(inp.tokens, tokens.reshape(-1))
            tensor_set(opt_ctx.labels, _one_hot(labels, model.cfg.n_vocab))
            opt_ctx.eval(result)
    return result


def last_logits(model: LlamaModel):
    """A function ``window -> logits of its last token`` over one static forward graph.

    The window (at most ``n_ctx`` token ids) sits at the start of the context, padded with 0;
    the causal mask keeps the padding from reaching it.
    """
    inp = make_inputs(model, 1)
    ctx = ggopt.Context()
    logits = build_logits(ctx, model, inp)
    gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, False)
    ggopt.build_forward_expand(gf, logits)
    sched = model.sched
    sched.reset()
    sched.alloc_graph(gf)
    n_ctx, n_vocab = model.cfg.n_ctx, model.cfg.n_vocab
    buf = np.zeros(n_ctx, np.int32)

    def run(window: np.ndarray) -> np.ndarray:
        n = len(window)
        buf[:] = 0
        buf[:n] = window
        tensor_set(inp.tokens, buf)
        sched.graph_compute(gf)
        return tensor_get(logits).reshape(n_ctx, n_vocab)[n - 1]

    return run
