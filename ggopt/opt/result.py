"""Running statistics of evaluations: loss, predictions and accuracy."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..errors import DTypeError, ShapeError

__all__ = ["Result"]


class Result:
    """Accumulates the per-batch losses, predictions and correct counts of evaluations.

    Pass it to :meth:`OptContext.eval` (or :func:`epoch`); read it with :meth:`loss`,
    :meth:`pred` and :meth:`accuracy`.

    ggml: ``ggml_opt_result_t`` (``ggml_opt_result_init``).
    """

    def __init__(self) -> None:
        self._ndata = 0
        self._loss: list[np.float32] = []
        self._pred: list[np.ndarray] = []
        self._ncorrect = 0
        self._opt_period = -1
        self._loss_per_datapoint = False

    @property
    def ndata(self) -> int:
        """Number of datapoints evaluated so far (ggml: ``ggml_opt_result_ndata``)."""
        return self._ndata

    def reset(self) -> None:
        """Forget every evaluation (ggml: ``ggml_opt_result_reset``)."""
        self._ndata = 0
        self._loss.clear()
        self._pred.clear()
        self._ncorrect = 0

    def loss(self) -> tuple[float, float]:
        """Return ``(loss, uncertainty)``.

        For per-datapoint losses (MEAN, CROSS_ENTROPY, MEAN_SQUARED_ERROR) the loss is the mean
        over physical batches, with the ``1/opt_period`` scaling undone, and the uncertainty is
        its standard error. For SUM it is the total over batches and the uncertainty the sample
        standard deviation of the batch losses. With no batch: ``(0.0, nan)``; with one batch the
        uncertainty is NaN.

        ggml: ``ggml_opt_result_loss``.
        """
        n = len(self._loss)
        if n == 0:
            return 0.0, math.nan
        scale = np.float32(self._opt_period)
        total = 0.0
        total_sq = 0.0
        for value in self._loss:
            s = value * scale if self._loss_per_datapoint else value
            total += float(s)
            total_sq += float(s * s)
        mean = total / n
        loss = mean if self._loss_per_datapoint else total
        if n < 2:
            return loss, math.nan
        var = total_sq / n - mean * mean
        spread = var / (n - 1) if self._loss_per_datapoint else var * n / (n - 1)
        with np.errstate(invalid="ignore"):
            unc = float(np.sqrt(np.float64(spread)))
        return loss, unc

    def pred(self) -> np.ndarray:
        """Return the predicted classes (int32, one per datapoint; empty unless CROSS_ENTROPY).

        ggml: ``ggml_opt_result_pred``.
        """
        if not self._pred:
            return np.empty(0, dtype=np.int32)
        return np.concatenate(self._pred).astype(np.int32, copy=False)

    def accuracy(self) -> tuple[float, float]:
        """Return ``(accuracy, uncertainty)``: ``ncorrect/ndata`` and its binomial standard error.

        NaN when the loss has no accuracy (not CROSS_ENTROPY) or nothing was evaluated; the
        uncertainty is also NaN for fewer than 2 datapoints.

        ggml: ``ggml_opt_result_accuracy``.
        """
        if self._ncorrect < 0 or self._ndata == 0:
            return math.nan, math.nan
        acc = self._ncorrect / self._ndata
        if self._ndata < 2:
            return acc, math.nan
        return acc, math.sqrt(acc * (1.0 - acc) / (self._ndata - 1))

    def check_eval(self, loss_per_datapoint: bool, opt_period: int, nd: int) -> None:
        """Raise unless a batch of ``nd`` datapoints from such a context can be added (what
        :meth:`OptContext.eval` checks before it computes)."""
        _check_kind(self._ndata, len(self._loss), self._loss_per_datapoint, self._opt_period,
                    loss_per_datapoint, opt_period, nd)

    def add_eval(
        self,
        loss_per_datapoint: bool,
        opt_period: int,
        nd: int,
        loss: np.float32,
        pred: np.ndarray | None,
        ncorrect: int | None,
    ) -> None:
        """Record one evaluation of ``nd`` datapoints; call :meth:`check_eval` first."""
        if self._ndata == 0:
            self._loss_per_datapoint = loss_per_datapoint
            self._opt_period = opt_period
        self._ndata += nd
        self._loss.append(np.float32(loss))
        if pred is not None:
            self._pred.append(np.array(pred, dtype=np.int32).reshape(-1))
        if ncorrect is None or self._ncorrect < 0:
            self._ncorrect = -1
        else:
            self._ncorrect += int(ncorrect)

    def merge(self, parts: Iterable[Result]) -> None:
        """Append the evaluations of ``parts``, in order, as if this result had recorded them
        (the batches several ranks evaluated, combined). All of them are checked before
        anything changes: DTypeError for a part that is not a Result, ShapeError for one of
        another kind of context or batch size."""
        parts = list(parts)
        ndata, nbatch = self._ndata, len(self._loss)
        kind = (self._loss_per_datapoint, self._opt_period)
        for part in parts:
            if not isinstance(part, Result):
                raise DTypeError(f"Result.merge: parts must be Result, got "
                                 f"{type(part).__name__}")
            if not part.ndata:
                continue
            _check_kind(ndata, nbatch, *kind, part._loss_per_datapoint, part._opt_period,
                        part.ndata // len(part._loss))
            if not ndata:
                kind = (part._loss_per_datapoint, part._opt_period)
            ndata, nbatch = ndata + part.ndata, nbatch + len(part._loss)
        for part in parts:
            if not part.ndata:
                continue
            if not self._ndata:
                self._loss_per_datapoint, self._opt_period = kind
            self._ndata += part.ndata
            self._loss.extend(part._loss)
            self._pred.extend(p.copy() for p in part._pred)
            self._ncorrect = -1 if min(self._ncorrect, part._ncorrect) < 0 else \
                self._ncorrect + part._ncorrect


def _check_kind(ndata: int, nbatch: int, have_per_datapoint: bool, have_period: int,
                loss_per_datapoint: bool, opt_period: int, nd: int) -> None:
    """ShapeError unless ``nd`` datapoints of such a context may join ``ndata`` datapoints in
    ``nbatch`` batches of the kind ``(have_per_datapoint, have_period)``."""
    if ndata > 0 and (have_per_datapoint != loss_per_datapoint or have_period != opt_period):
        raise ShapeError(
            "result holds evaluations of another kind of context: loss_per_datapoint="
            f"{have_per_datapoint}, opt_period={have_period}; got "
            f"loss_per_datapoint={loss_per_datapoint}, opt_period={opt_period} (ggml_opt_eval)"
        )
    if ndata != nd * nbatch:
        raise ShapeError(
            f"varying batch size not supported: result holds {ndata} datapoints in "
            f"{nbatch} batches, new batch has {nd} datapoints (ggml_opt_eval)"
        )
