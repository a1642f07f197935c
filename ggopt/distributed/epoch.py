"""One epoch of a data-parallel context: the batches split across ranks, the results merged.

Global physical batch ``i`` is the one :func:`ggopt.opt.epoch` would evaluate i-th in one
process. Training: logical batch ``k`` is global batches ``k*P .. k*P+P-1`` (``P`` the
context's ``opt_period``); rank ``r`` of ``N`` evaluates the ``p = P/N`` batches starting at
``k*P + r*p``, and the optimizer step follows the all-reduce inside the context. Validation:
global batches go to the ranks in turn. After every logical batch (validation: every N
batches) the ranks exchange their per-batch results, so every rank's :class:`Result` holds
exactly what one process's would, in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DTypeError, ShapeError, StateError
from ..opt.progress import time_us
from ..opt.result import Result

if TYPE_CHECKING:
    from ..opt.context import OptContext
    from ..opt.dataset import Dataset
    from ..opt.training import EpochCallback

__all__ = ["epoch_data_parallel"]

_FN = "ggml_opt_epoch (data-parallel)"

#: ``ggopt.opt.training._epoch_batches``: (context, dataset, idata_split, fn) ->
#: (ndata_batch, ibatch_split, nbatches)
EpochBatches = Callable[["OptContext", "Dataset", int, str], tuple[int, int, int]]


def _check(opt_ctx: OptContext, dataset: Dataset, results: tuple[Result | None, Result | None],
           idata_split: int, epoch_batches: EpochBatches) -> tuple[int, int, int]:
    """The local checks of :func:`ggopt.opt.epoch` plus the data-parallel ones."""
    ndata_batch, ibatch_split, nbatches = epoch_batches(opt_ctx, dataset, idata_split, _FN)
    period = opt_ctx.opt_period
    if ibatch_split % period != 0:
        raise ShapeError(
            f"the training part ({ibatch_split} batches of {ndata_batch}) must be whole "
            f"logical batches of opt_period={period} physical batches when data-parallel "
            f"({_FN})"
        )
    if opt_ctx.state().counters.opt_i != 0:
        raise StateError(f"the context is inside an optimizer period; a data-parallel epoch "
                         f"starts at the beginning of one ({_FN})")
    for result in results:
        if result is not None and not isinstance(result, Result):
            raise DTypeError(f"results must be Result or None, got {type(result).__name__} "
                             f"({_FN})")
        if result is not None:
            result.check_eval(opt_ctx.loss_per_datapoint, period, ndata_batch)
    return ndata_batch, ibatch_split, nbatches


def epoch_data_parallel(
    opt_ctx: OptContext,
    dataset: Dataset,
    result_train: Result | None,
    result_eval: Result | None,
    idata_split: int,
    callback_train: EpochCallback | None,
    callback_eval: EpochCallback | None,
    epoch_batches: EpochBatches,
) -> None:
    """:func:`ggopt.opt.epoch` for a data-parallel context; collective, same arguments.

    Every rank passes its own copy of the same dataset, in the same shard order (shuffle
    with the context's generator on every rank, as :func:`ggopt.opt.fit` does). Callbacks
    run once per logical batch (validation: once per round of N batches) with ``ibatch``
    counting the global physical batches done. Disagreeing ranks (dataset size, shard order,
    split, results passed or not) get the same :class:`ShapeError` on every rank.
    """
    comm = opt_ctx.comm
    assert comm is not None  # called for data-parallel contexts only
    results = (result_train, result_eval)
    ndata_batch, ibatch_split, nbatches = comm.run_all(
        _FN, lambda: _check(opt_ctx, dataset, results, idata_split, epoch_batches)
    )
    labels = dataset.labels
    comm.agree(_FN, "the epoch", {
        "ndata": dataset.ndata,
        "ndata_shard": dataset.ndata_shard,
        "datapoint (type, ne)": (dataset.data.type.name, dataset.data.ne[0]),
        "label (type, ne)": None if labels is None else (labels.type.name, labels.ne[0]),
        "idata_split": ibatch_split * ndata_batch,
        "shard order (digest)": hashlib.blake2b(dataset.permutation.tobytes(),
                                                digest_size=16).hexdigest(),
        "results passed (train, eval)": tuple(r is not None for r in results),
    })
    inputs, labels_batch = opt_ctx.inputs, opt_ctx.labels
    assert inputs is not None  # static graphs
    size, rank = comm.size, comm.rank
    period = opt_ctx.opt_period
    local = period // size

    t_start = time_us()
    for k in range(ibatch_split // period):
        parts = []
        for j in range(local):
            dataset.get_batch(inputs, labels_batch, k * period + rank * local + j)
            opt_ctx.alloc(True)
            part = None if result_train is None else Result()
            opt_ctx.eval(part)
            parts.append(part)
        if result_train is not None:
            result_train.merge(p for rank_parts in comm.allgather(parts) for p in rank_parts)
        if callback_train is not None:
            callback_train(True, opt_ctx, dataset, result_train, (k + 1) * period,
                           ibatch_split, t_start)

    t_start = time_us()
    neval = nbatches - ibatch_split
    for first in range(0, neval, size):
        part = None
        if first + rank < neval:
            dataset.get_batch(inputs, labels_batch, ibatch_split + first + rank)
            opt_ctx.alloc(False)
            part = None if result_eval is None else Result()
            opt_ctx.eval(part)
        if result_eval is not None:
            result_eval.merge(p for p in comm.allgather(part) if p is not None)
        if callback_eval is not None:
            callback_eval(False, opt_ctx, dataset, result_eval, min(first + size, neval), neval,
                          t_start)
