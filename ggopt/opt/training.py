"""High-level training loops: :func:`epoch` and :func:`fit`.

Like ggml's, these use only the public API of ggopt; copy and adapt them freely.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TextIO

import numpy as np

from ..errors import DTypeError, InvalidValueError, ShapeError, StateError
from ..io.paths import check_output_path
from ..tensor import Tensor
from .checks import check_int
from .context import OptContext
from .dataset import Dataset
from .enums import LossType, OptimizerType
from .params import OptimizerParams, default_params, get_default_optimizer_params
from .progress import epoch_callback_progress_bar, format_hms, time_us
from .result import Result
from .schedule import Schedule

__all__ = ["EpochCallback", "EpochOptPars", "BatchStep", "EpochRunner", "Stats", "epoch", "fit",
           "FitHistory", "fit_split", "fit_run", "run_batches", "static_step", "train_epochs",
           "result_stats"]

if TYPE_CHECKING:
    from ..backend.sched import Scheduler
    from ..context import Context
    from ..distributed.comm import Communicator


class EpochCallback(Protocol):
    """``callback(train, opt_ctx, dataset, result, ibatch, ibatch_max, t_start_us)``, called
    after every batch's eval (ggml's ``ggml_opt_epoch_callback``);
    e.g. :func:`~ggopt.opt.progress.epoch_callback_progress_bar`."""

    def __call__(self, train: bool, opt_ctx: OptContext, dataset: Dataset,
                 result: Result | None, ibatch: int, ibatch_max: int, t_start_us: int,
                 /) -> None: ...


#: ``get_opt_pars(epoch) -> OptimizerParams`` as :func:`fit` calls it: with the 1-based epoch.
EpochOptPars = Callable[[int], OptimizerParams]


def _check_dataset(dataset: Dataset, inputs: Tensor, loss_type: LossType, fn: str) -> None:
    """Raise unless ``dataset`` fits ``inputs`` and the loss's need for labels."""
    data = dataset.data
    if data.ne[0] != inputs.ne[0]:
        raise ShapeError(
            f"datapoints have {data.ne[0]} elements but inputs.ne[0]={inputs.ne[0]} ({fn})"
        )
    takes_labels = loss_type in (LossType.CROSS_ENTROPY, LossType.MEAN_SQUARED_ERROR)
    if takes_labels != (dataset.labels is not None):
        raise ShapeError(
            f"the {loss_type.name} loss {'takes' if takes_labels else 'takes no'} labels but "
            f"the dataset has {'labels' if dataset.labels is not None else 'none'} ({fn})"
        )


def _epoch_batches(
    opt_ctx: OptContext, dataset: Dataset, idata_split: int, fn: str
) -> tuple[int, int, int]:
    """Check an epoch's arguments; return ``(ndata_batch, ibatch_split, nbatches)``."""
    if not isinstance(dataset, Dataset):
        raise DTypeError(f"dataset must be a Dataset, got {type(dataset).__name__} ({fn})")
    if not opt_ctx.static_graphs:
        raise StateError(f"ggml_opt_epoch requires static graphs ({fn})")
    inputs, data = opt_ctx.inputs, dataset.data
    assert inputs is not None  # static graphs have their inputs from the start
    _check_dataset(dataset, inputs, opt_ctx.loss_type, fn)
    ndata = data.ne[1]
    ndata_batch = inputs.ne[1]
    if ndata % ndata_batch != 0:
        raise ShapeError(
            f"ndata={ndata} is not a multiple of the batch size inputs.ne[1]={ndata_batch} ({fn})"
        )
    nbatches = ndata // ndata_batch
    idata_split = check_int(idata_split, "idata_split", fn)
    if idata_split < 0:
        idata_split = ndata
    if idata_split % ndata_batch != 0 or idata_split > ndata:
        raise ShapeError(
            f"idata_split={idata_split} must be a multiple of the batch size {ndata_batch} and "
            f"at most ndata={ndata} ({fn})"
        )
    return ndata_batch, idata_split // ndata_batch, nbatches


def epoch(
    opt_ctx: OptContext,
    dataset: Dataset,
    result_train: Result | None,
    result_eval: Result | None,
    idata_split: int,
    callback_train: EpochCallback | None = None,
    callback_eval: EpochCallback | None = None,
) -> None:
    """Train on the first ``idata_split`` datapoints, then evaluate on the rest.

    Batches follow the dataset's current shard order (no shuffling here). Each batch is
    copied into the context's static inputs (and labels), then allocated and evaluated; the
    callback runs after every eval with ``ibatch`` counting from 1 within its part.

    Parameters
    ----------
    opt_ctx : OptContext
        With static graphs; ``inputs.ne[1]`` datapoints per physical batch.
    dataset : Dataset
        ``ne_datapoint`` equal to ``inputs.ne[0]``, ``ndata`` a multiple of the batch size.
    result_train, result_eval : Result or None
    idata_split : int
        Datapoints used for training (a multiple of the batch size); negative means all.
    callback_train, callback_eval : callable or None
        E.g. :func:`epoch_callback_progress_bar`.

    A data-parallel context (``opt_ctx.comm`` set) splits the batches across its ranks; see
    :func:`ggopt.distributed.epoch.epoch_data_parallel`.

    The epoch holds the scheduler and the context throughout, so epochs from several threads
    run one after the other. If an exception (or KeyboardInterrupt) stops it, the context is
    left ready for the next alloc.

    ggml: ``ggml_opt_epoch``.
    """
    fn = "ggml_opt_epoch"
    if not isinstance(opt_ctx, OptContext):
        raise DTypeError(f"opt_ctx must be an OptContext, got {type(opt_ctx).__name__} ({fn})")
    # Hold the scheduler and the context for the whole epoch (other threads wait), and never
    # leave an alloc waiting for an eval that an exception or interrupt cut short.
    with opt_ctx.locked():
        try:
            if opt_ctx.comm is not None:
                from ..distributed.epoch import epoch_data_parallel

                epoch_data_parallel(opt_ctx, dataset, result_train, result_eval, idata_split,
                                    callback_train, callback_eval, _epoch_batches)
                return
            _, ibatch_split, nbatches = _epoch_batches(opt_ctx, dataset, idata_split, fn)
            run_batches(opt_ctx, dataset, range(ibatch_split), range(ibatch_split, nbatches),
                        result_train, result_eval, callback_train, callback_eval)
        except BaseException:
            opt_ctx.abandon()
            raise


#: ``step(opt_ctx, dataset, ibatch, train, result)``: compute batch ``ibatch`` of the dataset's
#: current order (a backward pass when ``train``) and add it to ``result``.
BatchStep = Callable[[OptContext, Dataset, int, bool, Result | None], None]


def static_step(opt_ctx: OptContext, dataset: Dataset, ibatch: int, train: bool,
                result: Result | None) -> None:
    """The batch step of static graphs (:func:`epoch`'s): copy the batch into the context's
    inputs and labels, alloc, eval."""
    assert opt_ctx.inputs is not None  # static graphs have their inputs from the start
    dataset.get_batch(opt_ctx.inputs, opt_ctx.labels, ibatch)
    opt_ctx.alloc(train)
    opt_ctx.eval(result)


def run_batches(opt_ctx: OptContext, dataset: Dataset, train_ids: Sequence[int],
                val_ids: Sequence[int], result_train: Result | None, result_eval: Result | None,
                callback_train: EpochCallback | None = None,
                callback_eval: EpochCallback | None = None,
                step: BatchStep = static_step) -> None:
    """Train on batches ``train_ids``, then evaluate ``val_ids`` (the dataset's current order),
    one ``step`` each (default :func:`static_step`; e.g. a fresh dynamic graph per
    micro-batch), a callback after each with ``ibatch`` counting from 1 within its part.

    Holds the scheduler and the context throughout; an exception (or KeyboardInterrupt)
    leaves the context ready for the next alloc.
    """
    with opt_ctx.locked():
        try:
            for train, ids, result, callback in ((True, train_ids, result_train, callback_train),
                                                 (False, val_ids, result_eval, callback_eval)):
                t_start = time_us()
                for i, ibatch in enumerate(ids):
                    step(opt_ctx, dataset, ibatch, train, result)
                    if callback is not None:
                        callback(train, opt_ctx, dataset, result, i + 1, len(ids), t_start)
        except BaseException:
            opt_ctx.abandon()
            raise


def fit_split(
    ndata: int, nbatch_logical: int, nbatch_physical: int, val_split: float
) -> tuple[int, int]:
    """Return ``(opt_period, idata_split)`` as :func:`fit` computes them.

    The training part is ``int(float32(1 - val_split) * float32(ndata // nbatch_logical))``
    logical batches, computed in float32 and truncated as ggml's C expression does.
    """
    fn = "ggml_opt_fit"
    if nbatch_logical < 1 or nbatch_physical < 1:
        raise ShapeError(
            f"nbatch_logical={nbatch_logical} and the physical batch size "
            f"{nbatch_physical} must be >= 1 ({fn})"
        )
    if ndata % nbatch_logical != 0:
        raise ShapeError(
            f"ndata={ndata} is not a multiple of nbatch_logical={nbatch_logical} ({fn})"
        )
    if nbatch_logical % nbatch_physical != 0:
        raise ShapeError(
            f"nbatch_logical={nbatch_logical} is not a multiple of the physical batch size "
            f"inputs.ne[1]={nbatch_physical} ({fn})"
        )
    try:
        vs = np.float32(val_split)
    except (TypeError, ValueError):
        raise DTypeError(f"val_split must be a float, got {val_split!r} ({fn})") from None
    except OverflowError:
        raise InvalidValueError(f"val_split must be in [0, 1), got {val_split} ({fn})") from None
    if not 0.0 <= vs < 1.0:
        raise InvalidValueError(f"val_split must be in [0, 1), got {val_split} ({fn})")
    opt_period = nbatch_logical // nbatch_physical
    nbatches_logical = ndata // nbatch_logical
    train_logical = int(np.float32((np.float32(1.0) - vs) * np.float32(nbatches_logical)))
    return opt_period, train_logical * opt_period * nbatch_physical


def fit_run(dataset: Dataset, nbatch_logical: int, nbatch_physical: int,
            val_split: float) -> dict[str, int | float | str]:
    """What a :func:`fit` run depends on, recorded in its checkpoints and checked on resume:
    the batch sizes, the validation split (as float32, as fit uses it) and the data."""
    return {"batch": int(nbatch_logical), "micro_batch": int(nbatch_physical),
            "val_split": float(np.float32(val_split)), "data": dataset.digest()}


@dataclasses.dataclass
class FitHistory:
    """Per-epoch statistics returned by :func:`fit`; every list has one entry per epoch.

    Validation entries are NaN when there is no validation data (``val_split=0``); accuracies
    are NaN unless the loss is CROSS_ENTROPY.
    """

    train_loss: list[float] = dataclasses.field(default_factory=list)
    train_loss_unc: list[float] = dataclasses.field(default_factory=list)
    train_acc: list[float] = dataclasses.field(default_factory=list)
    train_acc_unc: list[float] = dataclasses.field(default_factory=list)
    val_loss: list[float] = dataclasses.field(default_factory=list)
    val_loss_unc: list[float] = dataclasses.field(default_factory=list)
    val_acc: list[float] = dataclasses.field(default_factory=list)
    val_acc_unc: list[float] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seconds)

    #: epochs the resumed checkpoint held (0: a fresh run); the lists start after them
    resumed_after: int = 0
    #: why the run stopped before its last epoch ("" when it did not)
    stopped: str = ""

    def record(self, train: Stats, val: Stats, seconds: float) -> None:
        """Append one epoch's statistics."""
        for prefix, stats in (("train", train), ("val", val)):
            for name, value in zip(("loss", "loss_unc", "acc", "acc_unc"), stats, strict=True):
                getattr(self, f"{prefix}_{name}").append(value)
        self.seconds.append(seconds)


def _check_run_inputs(fn: str, checkpoint: object, schedule: Schedule | None, nepoch: int,
                      steps_per_epoch: int) -> None:
    """What :func:`fit` checks before any work: the checkpoint path can be written, every
    learning rate of the run is a usable float32."""
    if checkpoint is not None:
        check_output_path(checkpoint, f"checkpoint ({fn})")
    if schedule is not None:
        schedule.check_run(nepoch, steps_per_epoch, fn)


#: (loss, loss uncertainty, accuracy, accuracy uncertainty) of one part of an epoch
Stats = tuple[float, float, float, float]


def result_stats(result: Result) -> Stats:
    """Loss and accuracy with uncertainties of ``result``, NaN when it is empty."""
    if result.ndata == 0:
        return (math.nan,) * 4
    return (*result.loss(), *result.accuracy())


#: ``run_epoch(iepoch, result_train, result_val)``: train and evaluate epoch ``iepoch``
EpochRunner = Callable[[int, Result, Result], None]


def train_epochs(opt_ctx: OptContext, dataset: Dataset, nepoch: int, run_epoch: EpochRunner, *,
                 schedule: Schedule | None = None, shuffle_first: bool = False,
                 checkpoint: str | os.PathLike[str] | None = None,
                 resume: bool | Literal["force"] = False,
                 run: Mapping[str, int | float | str | bool] | None = None,
                 stats: Callable[[Result], Stats] = result_stats,
                 report: Callable[[int, Stats, Stats], None] | None = None,
                 stream: TextIO | None = None, history: FitHistory | None = None) -> FitHistory:
    """The epoch loop of :func:`fit` (and of any loop over a prepared context): resume, then
    per epoch ``run_epoch``, the history, a checkpoint.

    With ``resume`` the state (and the dataset's order, ``schedule``'s position) is loaded
    from ``checkpoint`` (``run`` compared, ``"force"`` to accept a different run) and the
    loop continues after its epoch; otherwise, with ``shuffle_first``, all shards are
    shuffled once. Each epoch sets ``schedule.epoch`` (0-based), calls ``run_epoch`` with
    fresh results, records ``stats`` of them, calls ``report`` and saves ``checkpoint``
    (with ``run``). ``stream``: where the resume note goes (None: nowhere). ``history``: the
    one to fill (its epochs so far survive an exception that stops the loop).
    """
    history = FitHistory() if history is None else history
    first_epoch = 1
    if resume and checkpoint is not None:
        first_epoch = opt_ctx.load_state(checkpoint, dataset, schedule, run=run,
                                         force=resume == "force") + 1
        history.resumed_after = first_epoch - 1
        if stream is not None:
            stream.write(f"ggml_opt_fit: resuming from '{os.fspath(checkpoint)}' after epoch "
                         f"{first_epoch - 1}\n")
    elif shuffle_first:
        dataset.shuffle(opt_ctx, -1)
    for iepoch in range(first_epoch, nepoch + 1):
        t_epoch = time.perf_counter()
        if schedule is not None:
            schedule.epoch = iepoch - 1
        result_train, result_val = Result(), Result()
        run_epoch(iepoch, result_train, result_val)
        train, val = stats(result_train), stats(result_val)
        history.record(train, val, time.perf_counter() - t_epoch)
        if report is not None:
            report(iepoch, train, val)
        if checkpoint is not None:
            opt_ctx.save_state(checkpoint, dataset, schedule, epoch=iepoch, run=run)
    return history


def fit(
    sched: Scheduler,
    ctx_compute: Context,
    inputs: Tensor,
    outputs: Tensor,
    dataset: Dataset,
    loss_type: LossType = LossType.MEAN,
    optimizer: OptimizerType = OptimizerType.ADAMW,
    get_opt_pars: EpochOptPars = get_default_optimizer_params,
    nepoch: int = 1,
    nbatch_logical: int = 1,
    val_split: float = 0.0,
    silent: bool = False,
    *,
    stream: TextIO | None = None,
    comm: Communicator | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool | Literal["force"] = False,
) -> FitHistory:
    """Train a model with static graphs for ``nepoch`` epochs.

    All shards are shuffled once (fixing the validation part), then the training part
    again before every epoch; shuffles are skipped when one logical batch holds everything.

    Parameters
    ----------
    sched, ctx_compute, inputs, outputs :
        As for :class:`OptParams`; ``inputs.ne[1]`` is the physical batch size.
    dataset : Dataset
    loss_type : LossType
    optimizer : OptimizerType
    get_opt_pars : callable
        ``get_opt_pars(epoch) -> OptimizerParams``, called once per optimizer step with the
        current 1-based epoch; a :class:`~ggopt.opt.schedule.Schedule` (for example
        :func:`~ggopt.opt.schedule.warmup_cosine`) also goes into the checkpoints.
    nepoch : int
    nbatch_logical : int
        Datapoints per optimizer step (torch: effective batch size); a multiple of the
        physical batch size, dividing ``ndata``. ``opt_period = nbatch_logical/inputs.ne[1]``.
    val_split : float
        Fraction in ``[0, 1)`` of logical batches held out for validation.
    silent : bool
        False: print a header and progress bars per epoch, as ggml does.
    stream : text stream, optional
        Where the progress goes (default ``sys.stderr``).
    comm : ggopt.distributed.Communicator, optional
        Not in ggml: train data-parallel over its ranks (``docs/distributed.md``). Every rank
        calls ``fit`` with the same arguments; only rank 0 prints; every rank returns the same
        history (and holds the same weights).
    checkpoint : path, optional
        Save the whole state there (:meth:`OptContext.save_state`, with the dataset's shard
        order and, when ``get_opt_pars`` is a :class:`Schedule`, its position) after every
        epoch.
    resume : bool or "force"
        Load ``checkpoint`` first and continue after the epoch it holds (``nepoch`` counts
        all epochs, those before the checkpoint included); the result is bit for bit the
        one of an uninterrupted run. The checkpoint records what the run depends on (logical
        and physical batch size, ``val_split``, a digest of the dataset); a different run is
        refused (StateError), or with ``"force"`` resumed with a
        :class:`~ggopt.opt.checkpoint.RunMismatchWarning` (no longer bit-exact).

    Returns
    -------
    FitHistory
        Train and validation loss/accuracy with uncertainties and seconds, per epoch run by
        this call (after a resume: the epochs after the checkpoint's).

    ggml: ``ggml_opt_fit`` (which returns nothing).
    """
    fn = "ggml_opt_fit"
    if not isinstance(dataset, Dataset):
        raise DTypeError(f"dataset must be a Dataset, got {type(dataset).__name__} ({fn})")
    if not isinstance(inputs, Tensor):
        raise DTypeError(f"inputs must be a Tensor, got {type(inputs).__name__} ({fn})")
    if not callable(get_opt_pars):
        raise DTypeError(f"get_opt_pars must be callable ({fn})")
    nepoch = check_int(nepoch, "nepoch", fn)
    if nepoch < 0:
        raise InvalidValueError(f"nepoch must be >= 0, got {nepoch} ({fn})")
    nbatch_logical = check_int(nbatch_logical, "nbatch_logical", fn)
    loss_type = LossType.coerce(loss_type, fn)
    _check_dataset(dataset, inputs, loss_type, fn)
    ndata = dataset.data.ne[1]
    opt_period, idata_split = fit_split(ndata, nbatch_logical, inputs.ne[1], val_split)
    if resume not in (False, True, "force"):
        raise InvalidValueError(f"resume must be True, False or 'force', got {resume!r} ({fn})")
    if resume and checkpoint is None:
        raise StateError(f"resume=True needs a checkpoint path ({fn})")
    schedule = get_opt_pars if isinstance(get_opt_pars, Schedule) else None
    _check_run_inputs(fn, checkpoint, schedule, nepoch, idata_split // nbatch_logical)

    t_start = time.perf_counter()
    current = [1]  # the epoch running, for get_opt_pars
    params = default_params(sched, loss_type)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, outputs
    params.opt_period = opt_period
    params.get_opt_pars = lambda _ud: get_opt_pars(current[0])
    params.optimizer = optimizer
    params.comm = comm
    silent = silent or (comm is not None and comm.rank != 0)
    out = sys.stderr if stream is None else stream
    callback = None if silent else functools.partial(epoch_callback_progress_bar, stream=out)
    run = None if checkpoint is None else fit_run(dataset, nbatch_logical, inputs.ne[1],
                                                  val_split)
    with OptContext(params) as opt_ctx:

        def run_epoch(iepoch: int, result_train: Result, result_val: Result) -> None:
            current[0] = iepoch
            if nbatch_logical < idata_split:
                dataset.shuffle(opt_ctx, idata_split)
            if not silent:
                out.write(f"{fn}: epoch {iepoch:04d}/{nepoch:04d}:\n")
            epoch(opt_ctx, dataset, result_train, result_val, idata_split, callback, callback)
            if not silent:
                out.write("\n")

        history = train_epochs(opt_ctx, dataset, nepoch, run_epoch, schedule=schedule,
                               shuffle_first=nbatch_logical < ndata, checkpoint=checkpoint,
                               resume=resume, run=run, stream=None if silent else out)
    if not silent:
        out.write(f"{fn}: training took {format_hms(int((time.perf_counter() - t_start) * 1e6))}\n")
        out.flush()
    return history
