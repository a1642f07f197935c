"""Fine-tuning a llama on token windows (:mod:`.windows`, :mod:`.chat`) through ggopt.opt.

Every micro-batch (``n_ubatch`` windows) has the same shape, so by default one static graph is
built up front (``static=True``) and run through :class:`~ggopt.opt.OptContext`, an optimizer
step every ``n_batch / n_ubatch`` micro-batches. ``static=False`` builds a fresh forward graph
per micro-batch through the dynamic-graph API (``prepare_alloc`` -> ``alloc`` -> ``eval``), as
llama.cpp's ``llama-finetune`` does: the same bits, about 0.1 s more per SmolLM2 step. Whatever
is a PARAM trains: every weight for a full fine-tune (``token_embd`` included; a tied output
sums both uses' gradients), only the adapter with :func:`ggopt.lm.lora.attach` (its input
dropped out in training with the adapter's ``dropout``, :mod:`.lora_dropout`). Packed chat
windows (:attr:`Windows.segments`) set their positions and masks per micro-batch
(:func:`~ggopt.models.llama.set_segments`).

The loss (a :attr:`LossType.SUM` output): ``w * cross_entropy_loss_ids(logits, labels,
MASKED)``, ggml's cross-entropy with one-hot labels (the same bits) read from the label ids, so
no ``[n_vocab, N]`` one-hot tensor exists; a masked position (label :data:`MASKED`) adds
nothing to the loss and its logits' gradient is exactly zero. ``w = n_rows / n_trained`` over
the optimizer step's micro-batches, which makes the step's loss and gradient exactly those of
the mean over its trained tokens (PyTorch's ``ignore_index``). Without masked tokens ``w =
1/opt_period``: ggml's cross-entropy scaled as ggml scales it. The logits are not an output, so
their gradient takes their memory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TextIO

import numpy as np

import ggopt

from .. import F32, I32, Context, Tensor
from ..backend import alloc_ctx_tensors, tensor_set
from ..errors import InvalidValueError, ShapeError, StateError
from ..models.llama import Inputs, LlamaModel, build_logits, make_inputs, set_segments
from ..models.llama.mapped import check_trainable
from ..opt import LossType, OptContext, OptimizerParams, Result, constant, default_params
from ..opt.checks import check_int
from ..opt.dataset import Dataset
from ..opt.progress import time_us, token_progress_line, write_progress
from ..opt.schedule import Schedule
from ..opt.training import FitHistory, Stats, run_batches, train_epochs
from .controls import StepMonitor, StopTraining
from .finetune_params import FinetuneParams
from .lora import LoraAdapter
from .lora_dropout import DropoutMasks
from .windows import MASKED, Windows, split_point, to_dataset

if TYPE_CHECKING:
    from ..distributed import Communicator

__all__ = ["FinetuneParams", "EpochStats", "FineTuner"]

#: Nodes a micro-batch's graph may hold (a LoRA'd SmolLM2 forward has about 2200).
GRAPH_SIZE = 16384


@dataclasses.dataclass
class EpochStats:
    """Mean loss over the trained tokens of a part of the data (NaN when empty)."""

    loss: float
    n_tokens: int
    seconds: float

    @property
    def ppl(self) -> float:
        return math.exp(self.loss) if math.isfinite(self.loss) else math.nan


class _LossInputs:
    """The loss's own inputs: the label ids ``[N]`` (I32, :data:`MASKED` where a position is
    not trained) and the weight ``w`` (one value)."""

    def __init__(self, net: LlamaModel, n_rows: int) -> None:
        self.ctx = Context()
        self.labels = ggopt.set_name(self.ctx.new_tensor_1d(I32, n_rows), "labels")
        self.weight = ggopt.set_name(self.ctx.new_tensor_1d(F32, 1), "loss_weight")
        for t in (self.labels, self.weight):
            ggopt.set_input(t)
        alloc_ctx_tensors(self.ctx, net.sched.get_backend(0))

    def loss(self, ctx: Context, logits: Tensor) -> Tensor:
        ce = ggopt.cross_entropy_loss_ids(ctx, logits, self.labels, MASKED)
        return ggopt.set_name(ggopt.mul(ctx, ce, self.weight), "finetune_loss")

    def set(self, labels: np.ndarray, weight: float) -> None:
        """The label ids (checked against the vocabulary once, by ``Windows.check_vocab`` when
        the FineTuner is made) and the weight."""
        flat = labels.reshape(-1)
        tensor_set(self.labels, flat.astype(np.int32, copy=False))
        tensor_set(self.weight, np.array([weight], np.float32))


class FineTuner:
    """An optimization context over ``net``'s PARAM tensors and the windows' dataset.

    Data-parallel with ``comm`` (ranks > 1): rank ``r`` of ``N`` computes micro-batches
    ``k*P + r*P/N ...`` of optimizer step ``k`` (``P = opt_period``, which ``N`` must divide)
    with the loss weights of the whole step, the gradients all-reduced inside the context;
    validation micro-batches go to the ranks in turn; the statistics are combined over the
    ranks, so every rank reports what one process would (up to the order of the sums).
    """

    def __init__(self, net: LlamaModel, windows: Windows, fp: FinetuneParams,
                 get_opt_pars: Callable[..., OptimizerParams] | None = None,
                 comm: Communicator | None = None) -> None:
        fp.check()
        check_trainable(net, "finetune")
        self.size, self.rank = (1, 0) if comm is None else (comm.size, comm.rank)
        if fp.opt_period % self.size:
            raise ShapeError(f"finetune: {self.size} ranks must divide the micro-batches per "
                             f"optimizer step ({fp.n_batch} / {fp.n_ubatch} = "
                             f"{fp.opt_period}); use a smaller --ubatch")
        if windows.n_ctx > net.cfg.n_ctx:
            raise ShapeError(f"finetune: windows of {windows.n_ctx} tokens exceed the model's "
                             f"context of {net.cfg.n_ctx}")
        windows.check_vocab(net.cfg.n_vocab, "finetune")
        self.net, self.fp, self.windows = net, fp, windows
        self.dataset = to_dataset(windows)
        self.n_train_mb, self.n_val_mb = self._split(windows, fp)
        T = windows.n_ctx
        self.inp: Inputs = make_inputs(net, fp.n_ubatch, T, packed=windows.packed)
        self.loss_in = _LossInputs(net, fp.n_ubatch * T)
        adapter = getattr(net.projection, "__self__", None)  # lora.attach's bound project
        #: the LoRA dropout's mask inputs (an attached adapter with a dropout > 0), else None
        self.dropout: DropoutMasks | None = DropoutMasks(
            net, adapter, fp.n_ubatch * T, fp.seed) if isinstance(adapter, LoraAdapter) \
            and adapter.dropout > 0 else None
        params = default_params(net.sched, LossType.SUM)
        params.opt_period = fp.opt_period
        params.rng_seed = fp.seed
        params.comm = comm
        params.grad_clip = fp.grad_clip
        base = OptimizerParams()
        base.adamw.wd = fp.wd
        self.schedule = get_opt_pars if get_opt_pars is not None else constant(fp.lr, base)
        params.get_opt_pars = self.schedule
        if fp.static:
            params.graph_size = GRAPH_SIZE
            params.ctx_compute = Context()
            params.inputs = self.inp.tokens
            params.outputs = self.loss_in.loss(params.ctx_compute, self._logits(
                params.ctx_compute))
        self.opt_ctx = OptContext(params)
        self._step_ctx: Context | None = None  # the dynamic graph's context of the last step
        self._steps = 0  # optimizer steps, when the rates come from a plain callable
        self._projection = net.projection  # what the static graphs were built with
        self._tokens = np.empty((fp.n_ubatch, T), np.int32)
        self._labels = np.empty((fp.n_ubatch, T), np.int32)
        #: step-level controls (max steps, validation every N steps, early stopping, the
        #: best state, the JSON-lines log), called after every optimizer step
        self.monitor: StepMonitor | None = None
        #: mid-epoch checkpoints: where, and every how many optimizer steps (fit sets the
        #: path; None: only at the ends of epochs and on request_stop)
        self.checkpoint: str | os.PathLike[str] | None = None
        self.save_every: int | None = None
        self.stop_requested = False
        self.train_seconds = 0.0
        self.train_tokens = 0  # tokens computed (padding and masked prompts included)
        self.real_tokens = 0  # of them, the real ones (the padding of chat windows left out)
        self.trained_tokens = 0  # of them, those with a label (the loss is over them)

    def _logits(self, ctx: Context) -> Tensor:
        """The micro-batch's logits in ``ctx``: the weights rounded to BF16 in the graph when
        the fine-tune's (or the model's) compute type is bf16; ggopt's float order (training
        needs no llama.cpp bits, and its products are faster)."""
        bf16 = "bf16" in (self.fp.compute_type, self.net.compute_type)
        net = self.net if self.dropout is None else \
            dataclasses.replace(self.net, projection=self.dropout.project)
        return build_logits(ctx, net, self.inp, output=False,
                            compute_type="bf16" if bf16 else "f32", ggml_order=False)

    @staticmethod
    def _split(windows: Windows, fp: FinetuneParams) -> tuple[int, int]:
        """``(training, held-out)`` micro-batches; ShapeError without one whole step."""
        n = len(windows) // fp.n_ubatch
        ntrain = split_point(n, fp.val_split)
        n_train_mb = ntrain - ntrain % fp.opt_period
        if n_train_mb < 1:
            raise ShapeError(f"finetune: {len(windows)} windows give {n} micro-batches of "
                             f"{fp.n_ubatch}, {ntrain} for training; one batch needs "
                             f"{fp.opt_period} (more data or a smaller --batch)")
        return n_train_mb, n - ntrain

    @staticmethod
    def count_steps(windows: Windows, fp: FinetuneParams) -> int:
        """Optimizer steps per epoch a FineTuner over ``windows`` takes (for a schedule)."""
        fp.check()
        return FineTuner._split(windows, fp)[0] // fp.opt_period

    def _rows(self, ids: list[int], perm: np.ndarray | None = None) -> list[int]:
        """The windows of micro-batches ``ids`` in the current order."""
        perm = self.dataset.permutation if perm is None else perm
        nub = self.fp.n_ubatch
        return [int(w) for i in ids for w in perm[i * nub:(i + 1) * nub]]

    def _step_weights(self, ids: list[int]) -> dict[int, float]:
        """``w`` per training micro-batch id: ``n_rows / n_trained`` of its optimizer step."""
        P, out = self.fp.opt_period, {}
        n_rows = self.fp.n_ubatch * self.windows.n_ctx
        perm = self.dataset.permutation
        for k in range(0, len(ids), P):
            step = ids[k:k + P]
            rows = self._rows(step, perm)
            n = int(np.count_nonzero(self.windows.labels[rows] != MASKED))
            w = float(np.float32(n_rows) / np.float32(n)) if n else 0.0
            if n == n_rows * P:
                w = float(np.float32(1.0) / np.float32(P))
            out.update({i: w for i in step})
        return out

    def microbatch(self, ibatch: int, train: bool, weight: float) -> tuple[float, int]:
        """Train on (or evaluate) micro-batch ``ibatch`` of the current order; returns the
        summed cross-entropy over its trained tokens and their count.

        ShapeError / InvalidValueError, before the context is touched, for an ``ibatch`` that
        is not one of the micro-batches or a ``weight`` that is not finite and >= 0."""
        self._check_microbatch(ibatch, weight)
        if not self.fp.static:
            ctx = Context()
            loss = self.loss_in.loss(ctx, self._logits(ctx))
            gf = ggopt.new_graph_custom(ctx, GRAPH_SIZE, True)
            ggopt.build_forward_expand(gf, loss)
            self.opt_ctx.prepare_alloc(ctx, gf, self.inp.tokens, loss)
            if self._step_ctx is not None:
                self._step_ctx.free()  # the last step's graph, freed now, not by a GC pause
            self._step_ctx = ctx
        self.opt_ctx.alloc(train)
        self.dataset.get_batch_host(self._tokens, self._labels, ibatch)
        tensor_set(self.inp.tokens, self._tokens.reshape(-1))
        if self.windows.segments is not None:  # packed: positions and masks per window
            set_segments(self.inp, self.net.cfg, self.windows.segments[self._rows([ibatch])])
        self.loss_in.set(self._labels, weight)
        if self.dropout is not None:
            if train:  # the step's counter: restored by a resume, the same on every rank
                self.dropout.fill(self.opt_ctx.state().counters.iteration, int(ibatch))
            else:
                self.dropout.fill_ones()
        result = Result()
        self.opt_ctx.eval(result)
        n = int(np.count_nonzero(self._labels != MASKED))
        value = result.loss()[0]
        return (value * self._labels.size / weight if weight else 0.0), n

    def _check_microbatch(self, ibatch: int, weight: float) -> None:
        if self.fp.static and self.net.projection is not self._projection:
            raise StateError("finetune: the model's projections changed (lora.attach) after "
                             "this static FineTuner built its graphs; make the FineTuner after "
                             "attaching the adapter")
        n = len(self.windows) // self.fp.n_ubatch
        if isinstance(ibatch, bool) or not isinstance(ibatch, (int, np.integer)) or \
                not 0 <= ibatch < n:
            raise ShapeError(f"finetune: micro-batch {ibatch!r} is not one of the {n} "
                             f"micro-batches (0 to {n - 1})")
        if not (isinstance(weight, (int, float, np.floating)) and math.isfinite(weight)
                and weight >= 0):
            raise InvalidValueError(f"finetune: the loss weight must be finite and >= 0, got "
                                    f"{weight!r}")

    def _run(self, ids: list[int], train: bool, progress: TextIO | None = None) -> EpochStats:
        """Micro-batches ``ids`` through :func:`ggopt.opt.training.run_batches` (the one
        epoch loop), each with its step's loss weight; ``progress``: a progress bar there."""
        t0 = time.perf_counter()
        weights = self._step_weights(ids) if train else {i: 1.0 for i in ids}
        sums = [0.0, 0, 0]  # loss, labels, real tokens
        done = [0, 0.0, 0]  # micro-batches, loss and labels at the last optimizer step
        local_period = self.fp.opt_period // self.size

        def step(opt_ctx: OptContext, dataset: Dataset, ibatch: int, train: bool,
                 result: Result | None) -> None:
            s, n = self.microbatch(ibatch, train, weights[ibatch])
            sums[0] += s
            sums[1] += n
            sums[2] += self.windows.real_tokens(self._rows([ibatch]))
            done[0] += 1
            if train and done[0] % local_period == 0:
                loss = (sums[0] - done[1]) / (sums[1] - done[2]) if sums[1] > done[2] \
                    else math.nan
                done[1], done[2] = sums[0], sums[1]
                self._after_step(loss)

        def bar(train: bool, opt_ctx: OptContext, dataset: Dataset, result: Result | None,
                ibatch: int, ibatch_max: int, t_start_us: int) -> None:
            assert progress is not None
            loss = sums[0] / sums[1] if sums[1] else math.nan
            write_progress(progress, token_progress_line(train, ibatch, ibatch_max, int(sums[2]),
                                                         loss, time_us() - t_start_us),
                           ibatch, ibatch_max)

        callback = bar if progress is not None and self.rank == 0 else None
        mine = self._own(ids, train)
        try:
            run_batches(self.opt_ctx, self.dataset, mine if train else [],
                        [] if train else mine, None, None, callback, callback, step=step)
        except (StopTraining, KeyboardInterrupt):
            if train:  # stopped after a whole step: what it trained still counts (under MPI,
                # the labelled tokens are this rank's share times the ranks)
                self.train_seconds += time.perf_counter() - t0
                n_windows = int(done[0]) * self.size * self.fp.n_ubatch
                self.train_tokens += n_windows * self.windows.n_ctx
                self.real_tokens += int(sums[2]) * self.size
                self.trained_tokens += int(sums[1]) * self.size
            raise
        total, count = sums[0], sums[1]
        comm = self.opt_ctx.comm
        if comm is not None:
            parts = comm.allgather((total, count))
            total, count = sum(p[0] for p in parts), sum(p[1] for p in parts)
        seconds = time.perf_counter() - t0
        if train:
            self.train_seconds += seconds
            self.train_tokens += len(ids) * self.fp.n_ubatch * self.windows.n_ctx
            self.real_tokens += self.windows.real_tokens(self._rows(ids))
            self.trained_tokens += int(count)
        return EpochStats(total / count if count else math.nan, int(count), seconds)

    def _after_step(self, loss: float) -> None:
        """After one finished optimizer step: :attr:`monitor`, a mid-epoch checkpoint every
        :attr:`save_every` steps, the stop :meth:`request_stop` asked for (the state saved
        first when there is a checkpoint)."""
        self._steps += 1
        step = self.steps_done
        if self.monitor is not None:
            self._monitor_step(loss)
        if self.checkpoint is not None and (
                self.stop_requested or (self.save_every and step % self.save_every == 0)):
            self.save(self.checkpoint, self._epochs_done())
        if self.stop_requested:
            where = f"; the state is saved in {os.fspath(self.checkpoint)}" \
                if self.checkpoint is not None else ""
            raise StopTraining(f"interrupted at step {step}{where}")

    @property
    def steps_done(self) -> int:
        """Optimizer steps taken over the run (a resume continues the count)."""
        sched = self.schedule
        return sched.step if isinstance(sched, Schedule) else self._steps

    def _epochs_done(self) -> int:
        sched = self.schedule
        return sched.epoch if isinstance(sched, Schedule) else 0

    def request_stop(self) -> None:
        """Stop after the optimizer step in progress (e.g. from a SIGINT handler): with a
        checkpoint the exact state is saved there (shard order, generator, schedule, the
        epoch's position), and ``fit(..., resume=True)`` continues it bit for bit."""
        self.stop_requested = True

    def _monitor_step(self, loss: float) -> None:
        """Hand one finished optimizer step to :attr:`monitor` (the step counted over the run
        by the schedule, which a resume restores)."""
        assert self.monitor is not None
        sched = self.schedule
        if isinstance(sched, Schedule):
            step, epoch, lr = sched.step, sched.epoch + 1, sched.lr_at(sched.step - 1,
                                                                       sched.epoch)
        else:
            step, epoch, lr = self._steps, 0, self.fp.lr
        n_tokens = self.fp.n_batch * self.windows.n_ctx
        self.monitor.after_step(step, epoch, loss, lr, n_tokens)

    def trainable(self) -> list[Tensor]:
        """The tensors the optimizer trains (the adapter's under LoRA)."""
        return list(self.opt_ctx.state().params)

    def _own(self, ids: list[int], train: bool) -> list[int]:
        """This rank's share of ``ids``: its ``P/N`` of every optimizer step's micro-batches
        (training), every ``N``-th one (validation)."""
        if self.size == 1:
            return ids
        if not train:
            return ids[self.rank::self.size]
        period = self.fp.opt_period
        local = period // self.size
        return [i for k in range(0, len(ids), period)
                for i in ids[k + self.rank * local:k + (self.rank + 1) * local]]

    def validate(self, progress: TextIO | None = None) -> EpochStats:
        """The mean loss over the held-out windows' trained tokens (no training)."""
        return self._run(list(range(self.n_train_mb, self.n_train_mb + self.n_val_mb)), False,
                         progress)

    def train_epoch(self, progress: TextIO | None = None) -> EpochStats:
        """Shuffle the training windows and train on each once; right after a resume from a
        mid-epoch checkpoint, continue that epoch's order where it stopped (no shuffle)."""
        done = self._steps_into_epoch()
        if done == 0:
            self.dataset.shuffle(self.opt_ctx, self.n_train_mb * self.fp.n_ubatch)
        return self._run(list(range(done * self.fp.opt_period, self.n_train_mb)), True,
                         progress)

    def _steps_into_epoch(self) -> int:
        """Optimizer steps of the current epoch already taken (0 but after a mid-epoch
        resume): the schedule's step count against the epochs done."""
        sched = self.schedule
        if not isinstance(sched, Schedule):
            return 0
        done = sched.step - sched.epoch * self.steps_per_epoch
        return done if 0 < done < self.steps_per_epoch else 0

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch."""
        return self.n_train_mb // self.fp.opt_period

    def _run_key(self) -> dict[str, int | float | str]:
        """What a checkpoint must match to resume bit for bit (the data, batches, split)."""
        key: dict[str, int | float | str] = {
            "ctx": self.windows.n_ctx, "batch": self.fp.n_batch, "micro_batch": self.fp.n_ubatch,
            "val_split": self.fp.val_split, "data": self.dataset.digest()}
        if self.fp.compute_type != "f32":  # an F32 run's checkpoints stay as they were
            key["compute_type"] = self.fp.compute_type
        if self.dropout is not None:  # so do those of a run without dropout
            key["lora_dropout"] = self.dropout.p
            key["lora_dropout_seed"] = self.fp.seed
        if self.fp.grad_clip is not None:  # so are those of a run without clipping
            key["grad_clip"] = self.fp.grad_clip
        if self.windows.packed:  # and those of padded chat windows
            key["chat_pack"] = 1
        return key

    def fit(self, n_epochs: int, checkpoint: str | os.PathLike[str] | None = None,
            resume: bool | Literal["force"] = False,
            report: Callable[[int, EpochStats, EpochStats], None] | None = None,
            progress: TextIO | None = None) -> FitHistory:
        """Epochs up to ``n_epochs`` on :func:`ggopt.opt.training.train_epochs` (the one epoch
        loop of ``fit``): with ``resume``, continue after ``checkpoint``'s epoch (the
        schedule's position included: bit for bit an uninterrupted run's weights); the
        training state is saved to ``checkpoint`` after every epoch. ``report(epoch, train,
        validation)`` after each epoch (the validation's loss is NaN without held-out
        windows). The history's losses are the means over the trained tokens. A
        :attr:`monitor` may stop the run after a whole optimizer step (``history.stopped``
        says why; that epoch is neither recorded nor saved)."""
        n_epochs = check_int(n_epochs, "n_epochs", "finetune fit")
        if n_epochs < 0:
            raise InvalidValueError(f"finetune fit: n_epochs must be >= 0, got {n_epochs}")
        stats: dict[int, EpochStats] = {}

        def run_epoch(iepoch: int, result_train: Result, result_val: Result) -> None:
            stats[id(result_train)] = self.train_epoch(progress)
            stats[id(result_val)] = self.validate(progress) if self.n_val_mb else \
                EpochStats(math.nan, 0, 0.0)
            if report is not None:
                report(iepoch, stats[id(result_train)], stats[id(result_val)])

        def as_stats(result: Result) -> Stats:
            return (stats.pop(id(result)).loss, math.nan, math.nan, math.nan)

        history = FitHistory()
        self.checkpoint = checkpoint
        try:
            train_epochs(self.opt_ctx, self.dataset, n_epochs, run_epoch,
                         schedule=self.schedule if isinstance(self.schedule, Schedule)
                         else None, checkpoint=checkpoint, resume=resume,
                         run=self._run_key(), stats=as_stats,
                         stream=sys.stderr if resume and self.rank == 0 else None,
                         history=history)
        except StopTraining as stop:
            history.stopped = stop.reason
        return history

    def save(self, path: str | os.PathLike[str], epoch: int) -> None:
        """The whole training state after ``epoch`` epochs (atomically), as :meth:`fit`
        saves it."""
        self.opt_ctx.save_state(path, self.dataset, self._schedule(), epoch=epoch,
                                run=self._run_key())

    def resume(self, path: str | os.PathLike[str]) -> int:
        """Load a state written by :meth:`save` or :meth:`fit`; returns the epochs it holds."""
        return self.opt_ctx.load_state(path, self.dataset, self._schedule(),
                                       run=self._run_key())

    def _schedule(self) -> Schedule | None:
        return self.schedule if isinstance(self.schedule, Schedule) else None

    def close(self) -> None:
        """Release the optimization context, and with it the scheduler's compute buffers (the
        activations: most of a step's memory) while it holds this fine-tune's graph."""
        sched, loss = self.net.sched, self.opt_ctx.loss
        graph = sched.allocated_graph
        self.opt_ctx.close()
        if graph is not None and loss is not None and loss in graph.visited:
            sched.release_buffers()
