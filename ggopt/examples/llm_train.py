"""Training and evaluation of the llama example, as llama.cpp's ``llama_opt_epoch``.

Per micro-batch (``n_ubatch`` sequences) a fresh compute context and forward graph are built,
then ``prepare_alloc`` -> ``alloc(train)`` -> tokens and one-hot labels set -> ``eval``; an
optimizer step happens every ``opt_period = n_batch / n_ubatch`` micro-batches. With
``static=True`` the same model is trained through one static graph built up front (ggml's
``ggml_opt_epoch`` path); both give bit-identical weights.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Literal, TextIO

import numpy as np

import ggopt

from .. import Tensor
from ..backend import tensor_set
from ..distributed import Communicator
from ..errors import InvalidValueError, ShapeError, StateError
from ..io.paths import check_output_path
from ..models.llama import Inputs, LlamaModel, build_logits, make_inputs
from ..opt import (
    BuildType,
    Dataset,
    FitHistory,
    LossType,
    OptContext,
    OptimizerParams,
    Result,
    Schedule,
    constant,
    default_params,
    epoch_callback_progress_bar,
)
from ..opt.checks import check_float32
from ..opt.training import Stats, run_batches, train_epochs

__all__ = ["TrainParams", "Timing", "Trainer", "split", "bits_per_byte", "evaluate"]

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
            raise InvalidValueError(f"llm train: val_split must be in [0, 1), got "
                                    f"{self.val_split}")
        check_float32(self.lr, "lr", "llm train", low=0.0, low_open=True)
        check_float32(self.wd, "wd", "llm train", low=0.0, high=1.0)


@dataclasses.dataclass
class Timing:
    """Where the time of training micro-batches went (seconds, summed)."""

    n: int = 0
    build: float = 0.0  # compute context + graph + prepare_alloc + alloc
    total: float = 0.0  # the whole micro-batch: build, inputs, eval

    @property
    def build_share(self) -> float:
        return self.build / self.total if self.total else math.nan


def split(ndata: int, tp: TrainParams) -> tuple[int, int]:
    """``(training micro-batches, validation micro-batches)`` of ``ndata`` windows: the
    training part a whole number of optimizer steps, 1 - ``val_split`` of the micro-batches.

    Raises
    ------
    ShapeError
        Not even one optimizer step of training data.
    """
    nub = ndata // tp.n_ubatch
    ntrain = int(nub * (1.0 - tp.val_split))
    ntrain -= ntrain % tp.opt_period
    if ntrain < 1:
        raise ShapeError(
            f"llm train: {ndata} windows give {nub} micro-batches of {tp.n_ubatch}, "
            f"{int(nub * (1.0 - tp.val_split))} for training; expected at least one batch of "
            f"{tp.n_batch} sequences (more text or a smaller --batch)")
    return ntrain, nub - ntrain


def _labels_of(opt_ctx: OptContext) -> Tensor:
    """The context's (cross-entropy) labels tensor of the allocated graph."""
    labels = opt_ctx.labels
    assert labels is not None, "cross-entropy contexts have labels once allocated"
    return labels


def _one_hot(labels: np.ndarray, n_vocab: int) -> np.ndarray:
    out = np.zeros((labels.size, n_vocab), np.float32)
    out[np.arange(labels.size), labels.reshape(-1)] = 1.0
    return out


class Trainer:
    """An optimization context over ``model`` with its micro-batch inputs."""

    def __init__(self, model: LlamaModel, tp: TrainParams, seed: int = 5489,
                 comm: Communicator | None = None, schedule: Schedule | None = None) -> None:
        tp.check()
        self.size, self.rank = (1, 0) if comm is None else (comm.size, comm.rank)
        if tp.opt_period % self.size:
            raise ShapeError(f"llm train: {self.size} ranks must divide the micro-batches per "
                             f"optimizer step ({tp.n_batch} / {tp.n_ubatch} = "
                             f"{tp.opt_period}); use a smaller --ubatch")
        self.model, self.tp = model, tp
        self.inp: Inputs = make_inputs(model, tp.n_ubatch)
        params = default_params(model.sched, LossType.CROSS_ENTROPY)
        params.opt_period = tp.opt_period
        params.rng_seed = seed
        params.comm = comm
        base = OptimizerParams()
        base.adamw.wd = tp.wd
        # A schedule sets alpha per optimizer step; default: a constant tp.lr.
        self.schedule = schedule if schedule is not None else constant(tp.lr, base)
        params.get_opt_pars = self.schedule
        if tp.static:
            params.ctx_compute = ggopt.Context()
            params.inputs = self.inp.tokens
            params.outputs = build_logits(params.ctx_compute, model, self.inp)
        self.opt_ctx = OptContext(params)
        self.timing = Timing()
        self._step_ctx: ggopt.Context | None = None  # the last dynamic graph's context
        self._tokens = np.empty((tp.n_ubatch, model.cfg.n_ctx), np.int32)
        self._labels = np.empty((tp.n_ubatch, model.cfg.n_ctx), np.int32)

    def split(self, dataset: Dataset) -> tuple[int, int]:
        """``(training micro-batches, validation micro-batches)`` of ``dataset``."""
        return split(dataset.ndata, self.tp)

    def microbatch(self, dataset: Dataset, ibatch: int, train: bool,
                   result: Result | None) -> None:
        """Train on (``train``) or evaluate micro-batch ``ibatch`` of ``dataset``'s current
        order, adding to ``result``; as :meth:`epoch` does for each of its micro-batches."""
        self._step(self.opt_ctx, dataset, ibatch, train, result)

    def _step(self, opt_ctx: OptContext, dataset: Dataset, ibatch: int, train: bool,
              result: Result | None) -> None:
        """The batch step (:data:`ggopt.opt.training.BatchStep`) of this model: a fresh
        dynamic graph (unless static), alloc, tokens and one-hot labels, eval."""
        t0 = time.perf_counter()
        if not self.tp.static:
            ctx = ggopt.Context()
            logits = build_logits(ctx, self.model, self.inp)
            gf = ggopt.new_graph_custom(ctx, ggopt.GRAPH_DEFAULT_SIZE, True)
            ggopt.build_forward_expand(gf, logits)
            opt_ctx.prepare_alloc(ctx, gf, self.inp.tokens, logits)
            if self._step_ctx is not None:
                self._step_ctx.free()  # the last step's graph goes now, not in a GC pause
            self._step_ctx = ctx
        opt_ctx.alloc(train)
        t1 = time.perf_counter()
        dataset.get_batch_host(self._tokens, self._labels, ibatch)
        tensor_set(self.inp.tokens, self._tokens.reshape(-1))
        tensor_set(_labels_of(opt_ctx), _one_hot(self._labels, self.model.cfg.n_vocab))
        opt_ctx.eval(result)
        if train:
            t2 = time.perf_counter()
            self.timing.n += 1
            self.timing.build += t1 - t0
            self.timing.total += t2 - t0

    def epoch(self, dataset: Dataset, result_train: Result, result_val: Result,
              progress: TextIO | None = None, silent: bool = False) -> None:
        """Shuffle the training windows, train on them, evaluate the validation windows
        (:func:`ggopt.opt.training.run_batches` with this model's batch step).

        Data-parallel: rank ``r`` of ``N`` takes micro-batches ``k*P + r*P/N ...`` of
        optimizer step ``k`` (``P = opt_period``) and every ``N``-th validation micro-batch;
        the results hold this rank's micro-batches (see :func:`gather_stats`).
        """
        ntrain, nval = self.split(dataset)
        dataset.shuffle(self.opt_ctx, ntrain * self.tp.n_ubatch)
        period, size, rank = self.tp.opt_period, self.size, self.rank
        local = period // size
        train_ids = [k * period + rank * local + j
                     for k in range(ntrain // period) for j in range(local)]
        val_ids = list(range(ntrain + rank, ntrain + nval, size))
        callback = None if silent or rank != 0 else functools.partial(
            epoch_callback_progress_bar, stream=progress)
        run_batches(self.opt_ctx, dataset, train_ids, val_ids, result_train, result_val,
                    callback, callback, step=self._step)

    def fit(self, dataset: Dataset, nepoch: int, silent: bool = False,
            stream: TextIO | None = None, checkpoint: str | os.PathLike[str] | None = None,
            resume: bool | Literal["force"] = False) -> FitHistory:
        """Epochs up to ``nepoch`` (:func:`ggopt.opt.training.train_epochs`); returns the
        per-epoch statistics (over all ranks), printing one line per epoch. ``checkpoint``:
        save the whole training state there after every epoch; ``resume``: load it first and
        continue after its epoch (bit for bit the same weights as an uninterrupted run;
        refused when the checkpoint's run had other data, batch sizes or split, unless
        ``"force"``: then no longer bit-exact)."""
        if resume and checkpoint is None:
            raise StateError("llm train: resuming needs a checkpoint file")
        if checkpoint is not None:
            check_output_path(checkpoint, "llm train: checkpoint")
        comm = self.opt_ctx.comm
        run: dict[str, int | float | str] = {"batch": self.tp.n_batch,
                                             "micro_batch": self.tp.n_ubatch,
                                             "val_split": self.tp.val_split,
                                             "data": dataset.digest()}

        def run_epoch(iepoch: int, result_train: Result, result_val: Result) -> None:
            self.epoch(dataset, result_train, result_val, progress=stream, silent=silent)

        def report(iepoch: int, train: Stats, val: Stats) -> None:
            if not silent and self.rank == 0:
                print(epoch_line(iepoch, train, val), file=stream, flush=True)

        history = train_epochs(self.opt_ctx, dataset, nepoch, run_epoch,
                               schedule=self.schedule, checkpoint=checkpoint, resume=resume,
                               run=run, stats=functools.partial(gather_stats, comm),
                               report=report)
        if resume and checkpoint is not None and history.resumed_after >= nepoch:
            raise InvalidValueError(f"llm train: the checkpoint {os.fspath(checkpoint)!r} "
                                    f"already holds {history.resumed_after} epochs; ask for "
                                    "more than that")
        return history

    def close(self) -> None:
        self.opt_ctx.close()


def gather_stats(comm: Communicator | None, result: Result) -> Stats:
    """Loss and accuracy of ``result``, combined over the ranks of ``comm``: the mean of all
    micro-batch losses and the fraction of correct tokens (uncertainties: one rank's only
    when alone, else NaN)."""
    if comm is None:
        if not result.ndata:
            return (math.nan,) * 4
        return (*result.loss(), *result.accuracy())
    # every micro-batch holds the same number of tokens: weigh by tokens
    own = (result.loss()[0], result.ndata, result.accuracy()[0]) if result.ndata else (0, 0, 0)
    parts = [p for p in comm.allgather(own) if p[1]]
    n = sum(p[1] for p in parts)
    if not n:
        return (math.nan,) * 4
    loss = sum(p[0] * p[1] for p in parts) / n
    acc = sum(p[2] * p[1] for p in parts) / n
    return loss, math.nan, acc, math.nan


def epoch_line(iepoch: int, train: Stats, val: Stats) -> str:
    """``epoch N: train loss .. acc .. ppl .. bits/byte .. | val ...``."""
    parts = []
    for name, (loss, _, acc, _) in (("train", train), ("val", val)):
        if not math.isnan(loss):
            parts.append(f"{name} loss={loss:.4f} acc={100 * acc:.2f}% ppl={math.exp(loss):.3f}"
                         f" bits/byte={bits_per_byte(loss):.4f}")
    return f"epoch {iepoch}: " + " | ".join(parts)


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
            tensor_set(_labels_of(opt_ctx), _one_hot(labels, model.cfg.n_vocab))
            opt_ctx.eval(result)
    return result
