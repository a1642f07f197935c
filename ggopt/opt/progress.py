"""The epoch progress bar, drawn exactly as ggml draws it (loss and accuracy, for
classification), the bar of next-token training (loss, perplexity, tokens/s, no accuracy),
the clock they read, and how a redrawn bar goes to its sink: on a terminal, every redraw in
place (``\\r``); elsewhere (a CI log, a notebook, a pipe) a line at the start, every ~10 %, and
at the end (:func:`write_progress`)."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, TextIO

from ..errors import ShapeError, StateError
from .result import Result

if TYPE_CHECKING:
    from .context import OptContext
    from .dataset import Dataset

__all__ = ["time_us", "format_hms", "progress_bar_line", "token_progress_line",
           "epoch_callback_progress_bar", "is_terminal", "is_milestone", "write_progress"]

# Eighth blocks, full (8/8) down to 1/8; a cell filled to less than 1/8 is a space.
_CELLS = ("\u2588", "\u2589", "\u258a", "\u258b", "\u258c", "\u258d", "\u258e", "\u258f")
_BAR_LENGTH = 8


def time_us() -> int:
    """Microseconds of a monotonic clock (ggml: ``ggml_time_us``)."""
    return time.monotonic_ns() // 1000


def format_hms(t_us: int) -> str:
    """Format a duration in microseconds as ``HH:MM:SS`` (hours may take more digits)."""
    s = t_us // 1_000_000
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal, where a bar redrawn in place reads well (False when
    the stream cannot tell, or is closed)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def is_milestone(done: int, total: int) -> bool:
    """Whether ``done`` of ``total`` steps gets a line on a sink that is not a terminal: the
    first, each one that starts another tenth (``10 * done // total`` grows), and the last."""
    return done <= 1 or done >= total or 10 * done // total != 10 * (done - 1) // total


def write_progress(stream: TextIO, line: str, done: int, total: int,
                   terminal: bool | None = None) -> None:
    """Write one redraw ``line`` of a bar at ``done`` of ``total`` as suits ``stream``: on a
    terminal as it is (carriage returns redraw it in place); elsewhere only at a milestone
    (:func:`is_milestone`), as a line of its own (no carriage return, one newline).
    ``terminal``: what :func:`is_terminal` said of the stream, when the caller knows."""
    if terminal if terminal is not None else is_terminal(stream):
        stream.write(line)
    elif is_milestone(done, total):
        stream.write(line.replace("\r", "").rstrip(" \n") + "\n")
    else:
        return
    stream.flush()


def _fmt(x: float, decimals: int) -> str:
    """Format like C's ``%.Nf``, which spells a NaN with the sign bit set ``-nan``."""
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return f"{x:.{decimals}f}"


def _cells(ibatch: int, ibatch_max: int) -> str:
    cells = []
    for j in range(_BAR_LENGTH):
        for k in range(_BAR_LENGTH, 0, -1):
            if ibatch_max * (_BAR_LENGTH * j + k) // _BAR_LENGTH < _BAR_LENGTH * ibatch:
                cells.append(_CELLS[_BAR_LENGTH - k])
                break
        else:
            cells.append(" ")
    return "".join(cells)


def token_progress_line(train: bool, ibatch: int, ibatch_max: int, n_tokens: int,
                        loss: float, t_us: int) -> str:
    """One redraw of a language model's bar: ``train: [bar] 3/10 loss=3.18862 ppl=24.25
    512 tokens/s t=00:00:04 ETA=00:00:10 \r`` (``\n`` added after the last batch).

    ``n_tokens``: tokens computed so far (``tokens/s`` over ``t_us``); ``loss``: the mean
    cross-entropy over the trained tokens so far (``-`` while there is none). No accuracy:
    the argmax rule means nothing for next-token prediction on masked rows."""
    if ibatch < 1:
        raise ShapeError(f"ibatch counts batches done and must be >= 1, got {ibatch} "
                         "(token_progress_line)")
    rate = n_tokens * 1e6 / t_us if t_us > 0 else 0.0
    shown = f"loss={loss:.5f} ppl={math.exp(min(loss, 700.0)):.2f}" if math.isfinite(loss) \
        else "loss=-"
    line = (f"{'train: ' if train else 'val:   '}[{_cells(ibatch, ibatch_max)}] "
            f"{ibatch}/{ibatch_max} {shown} {rate:.0f} tokens/s t={format_hms(t_us)} "
            f"ETA={format_hms(t_us * (ibatch_max - ibatch) // ibatch)} \r")
    return line + "\n" if ibatch == ibatch_max else line


def progress_bar_line(
    train: bool,
    ibatch: int,
    ibatch_max: int,
    batch_size: int,
    loss: tuple[float, float],
    accuracy: tuple[float, float],
    t_us: int,
) -> str:
    """Return one redraw of the progress bar, ending in ``" \\r"`` (plus ``"\\n"`` when done).

    Parameters
    ----------
    train : bool
        ``"train: "`` or ``"val:   "`` prefix.
    ibatch, ibatch_max : int
        Batches done (``>= 1``) and in total.
    batch_size : int
        Datapoints per physical batch.
    loss, accuracy : (float, float)
        Values and uncertainties, as :meth:`Result.loss` and :meth:`Result.accuracy` return.
    t_us : int
        Microseconds since the loop started; the ETA is extrapolated from it.
    """
    if ibatch < 1:
        raise ShapeError(
            f"ibatch counts batches done and must be >= 1, got {ibatch} "
            "(ggml_opt_epoch_callback_progress_bar)"
        )
    eta_us = t_us * (ibatch_max - ibatch) // ibatch
    line = (
        f"{'train: ' if train else 'val:   '}[{_cells(ibatch, ibatch_max)}] "
        f"data={ibatch * batch_size:07d}/{ibatch_max * batch_size:07d} "
        f"loss={_fmt(loss[0], 5)}\u00b1{_fmt(loss[1], 5)} "
        f"acc={_fmt(100.0 * accuracy[0], 2)}\u00b1{_fmt(100.0 * accuracy[1], 2)}% "
        f"t={format_hms(t_us)} ETA={format_hms(eta_us)} \r"
    )
    if ibatch == ibatch_max:
        line += "\n"
    return line


def epoch_callback_progress_bar(
    train: bool,
    opt_ctx: OptContext,
    dataset: Dataset,
    result: Result | None,
    ibatch: int,
    ibatch_max: int,
    t_start_us: int,
    stream: TextIO | None = None,
) -> None:
    """Epoch callback that redraws a progress bar in place on ``stream`` (default stderr);
    where the stream is not a terminal, a line at the start, every ~10 % and at the end
    (:func:`write_progress`).

    Takes ggml's epoch-callback arguments in ggml's order; ``dataset`` is unused. A line
    reads ``train: [███▋    ] data=0001500/0003000 loss=0.06607±0.01276 acc=97.73±0.27%
    t=00:00:04 ETA=00:00:04 \\r`` (on one line), with ``\\n`` added after the last batch.

    ggml: ``ggml_opt_epoch_callback_progress_bar``.
    """
    if not isinstance(result, Result):
        raise StateError(
            f"the progress bar needs a Result to report, got {type(result).__name__} "
            "(ggml_opt_epoch_callback_progress_bar)"
        )
    inputs = opt_ctx.inputs
    if inputs is None:
        raise StateError("the progress bar reads the batch size from the context's inputs, "
                         "which it has once a graph is prepared "
                         "(ggml_opt_epoch_callback_progress_bar)")
    line = progress_bar_line(
        train,
        ibatch,
        ibatch_max,
        inputs.ne[1],
        result.loss(),
        result.accuracy(),
        time_us() - t_start_us,
    )
    write_progress(sys.stderr if stream is None else stream, line, ibatch, ibatch_max)
