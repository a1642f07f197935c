"""Learning curves of a :class:`ggopt.opt.FitHistory` as a PNG (needs the ``plot`` extra)."""

from __future__ import annotations

import math
import os
from types import ModuleType
from typing import Any

from ..io.atomic import atomic_path
from ..opt import FitHistory

__all__ = ["require_matplotlib", "history_figure", "plot_history", "log_figure", "plot_log"]


def require_matplotlib() -> ModuleType:
    """Import and return ``matplotlib.figure``; ImportError saying how to install it if absent."""
    try:
        from matplotlib import figure
    except ImportError as exc:
        raise ImportError(
            f"plotting needs matplotlib, which could not be imported ({exc}); install it with "
            "pip install 'ggopt[plot]'"
        ) from None
    return figure


def _finite(values: list[float]) -> bool:
    return any(math.isfinite(v) for v in values)


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    fmt = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format=fmt)


def log_figure(records: list[dict[str, Any]], title: str = "") -> Any:
    """The training loss per optimizer step and the validation losses (the one before
    training at step 0 included) of a fine-tune's JSON-lines log, as a matplotlib Figure."""
    figure = require_matplotlib()
    fig = figure.Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots(1, 1)

    def points(key: str) -> tuple[list[int], list[float]]:
        pairs = [(r["step"], r[key]) for r in records
                 if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    steps, loss = points("loss")
    if loss:
        ax.plot(steps, loss, "-", lw=1, alpha=0.7, label="train (per step)")
    steps, val = points("val_loss")
    if val:
        ax.plot(steps, val, "s--", ms=4, label="validation")
    ax.set(xlabel="optimizer step", ylabel="cross-entropy loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        fig.suptitle(title)
    return fig


def plot_log(records: list[dict[str, Any]], path: str | os.PathLike[str],
             title: str = "") -> None:
    """Write :func:`log_figure` to ``path`` (atomically; the format from the suffix)."""
    _save(log_figure(records, title), path)


def plot_history(history: FitHistory, path: str | os.PathLike[str], title: str = "",
                 before: float | None = None) -> None:
    """Write :func:`history_figure` to ``path`` (atomically; the format from the suffix)."""
    _save(history_figure(history, title, before), path)


def history_figure(history: FitHistory, title: str = "", before: float | None = None) -> Any:
    """Train/validation loss and accuracy per epoch, with their uncertainties, as a matplotlib
    ``Figure``.

    ``before``: the validation loss before training, drawn at epoch 0. The accuracy panel is
    left out when no accuracy was measured (next-token training); an uncertainty that was not
    measured (NaN) draws no error bar. Uses matplotlib's object API (no pyplot, no GUI backend).
    """
    figure = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    epochs = list(range(1, len(history) + 1))
    with_acc = _finite(history.train_acc + history.val_acc)
    fig = figure.Figure(figsize=(10 if with_acc else 5.5, 4), layout="constrained")
    axes = list(fig.subplots(1, 2)) if with_acc else [fig.subplots(1, 1)]
    ax_loss = axes[0]
    for part, style in (("train", "o-"), ("val", "s--")):
        loss, loss_unc = getattr(history, f"{part}_loss"), getattr(history, f"{part}_loss_unc")
        x, y = epochs, list(loss)
        if part == "val" and before is not None and math.isfinite(before):
            x, y, loss_unc = [0, *x], [before, *y], [math.nan, *loss_unc]
        if not _finite(y):
            continue
        yerr = loss_unc if _finite(loss_unc) else None
        ax_loss.errorbar(x, y, yerr=yerr, fmt=style, ms=3, capsize=2, label=part)
        if with_acc:
            acc, acc_unc = getattr(history, f"{part}_acc"), getattr(history, f"{part}_acc_unc")
            axes[1].errorbar(epochs, [100 * a for a in acc], yerr=[100 * u for u in acc_unc],
                             fmt=style, ms=3, capsize=2, label=part)
            axes[1].set(xlabel="epoch", ylabel="accuracy [%]")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    if title:
        fig.suptitle(title)
    return fig
